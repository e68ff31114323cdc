#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace dsaserve::io {

namespace fs = std::filesystem;
using nlohmann::json;

// A read-only private mapping of a whole file.
class MappedFile {
 public:
  explicit MappedFile(const fs::path& path) {
    // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer; it is refused below.
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    DSA_CHECK(fd_ >= 0, "{}: cannot open: {}", path.string(), std::strerror(errno));
    struct stat st {};
    if (::fstat(fd_, &st) != 0) {
      ::close(fd_);
      fail("{}: cannot stat: {}", path.string(), std::strerror(errno));
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd_);
      fail("{}: not a regular file (a FIFO, device or socket cannot be mapped)", path.string());
    }
    size_ = size_t(st.st_size);
    if (size_ > 0) {
      void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd_, 0);
      if (p == MAP_FAILED) {
        ::close(fd_);
        fail("{}: mmap failed: {}", path.string(), std::strerror(errno));
      }
      data_ = static_cast<const uint8_t*>(p);
    }
  }
  ~MappedFile() {
    if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
    if (fd_ >= 0) ::close(fd_);
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  int fd_ = -1;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

namespace {

constexpr size_t kMaxHeaderBytes = 100u << 20;  // like the reference implementation's limit

uint64_t json_u64(const json& v, const std::string& where) {
  DSA_CHECK(v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0),
            "{}: expected a non-negative integer, got {}", where, v.dump());
  return v.get<uint64_t>();
}

}  // namespace

std::vector<TensorInfo> SafetensorsFile::parse_header(const std::string& json_text, size_t data_bytes,
                                                      const std::string& origin,
                                                      std::map<std::string, std::string>* metadata) {
  json h;
  try {
    h = json::parse(json_text);
  } catch (const json::exception& e) {
    fail("{}: header is not valid JSON: {}", origin, e.what());
  }
  DSA_CHECK(h.is_object(), "{}: header is not a JSON object", origin);
  std::vector<TensorInfo> out;
  for (auto it = h.begin(); it != h.end(); ++it) {
    const std::string& name = it.key();
    const json& e = it.value();
    if (name == "__metadata__") {
      DSA_CHECK(e.is_object(), "{}: __metadata__ is not an object", origin);
      for (auto m = e.begin(); m != e.end(); ++m) {
        DSA_CHECK(m.value().is_string(), "{}: __metadata__.{} is not a string", origin, m.key());
        if (metadata != nullptr) (*metadata)[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string where = fmt::format("{}: tensor '{}'", origin, name);
    DSA_CHECK(e.is_object(), "{}: entry is not an object", where);
    for (auto k = e.begin(); k != e.end(); ++k) {
      DSA_CHECK(k.key() == "dtype" || k.key() == "shape" || k.key() == "data_offsets",
                "{}: unknown field '{}'", where, k.key());
    }
    DSA_CHECK(e.contains("dtype") && e["dtype"].is_string(), "{}: field 'dtype' missing or not a string",
              where);
    const std::string dt = e["dtype"].get<std::string>();
    const auto dtype = dtype_from_safetensors(dt);
    DSA_CHECK(dtype.has_value(), "{}: field 'dtype': unsupported dtype '{}'", where, dt);
    DSA_CHECK(e.contains("shape") && e["shape"].is_array(), "{}: field 'shape' missing or not an array",
              where);
    TensorInfo ti;
    ti.name = name;
    ti.dtype = *dtype;
    uint64_t numel = 1;
    for (const json& d : e["shape"]) {
      const uint64_t v = json_u64(d, where + " field 'shape'");
      DSA_CHECK(v <= uint64_t(std::numeric_limits<int64_t>::max()), "{}: field 'shape': dimension too large",
                where);
      DSA_CHECK(v == 0 || numel <= std::numeric_limits<uint64_t>::max() / v,
                "{}: field 'shape': size overflows", where);
      numel *= v;
      ti.shape.push_back(int64_t(v));
    }
    DSA_CHECK(e.contains("data_offsets") && e["data_offsets"].is_array() && e["data_offsets"].size() == 2,
              "{}: field 'data_offsets' missing or not [begin, end]", where);
    const uint64_t b = json_u64(e["data_offsets"][0], where + " field 'data_offsets'");
    const uint64_t en = json_u64(e["data_offsets"][1], where + " field 'data_offsets'");
    DSA_CHECK(b <= en, "{}: field 'data_offsets': begin {} > end {}", where, b, en);
    DSA_CHECK(en <= data_bytes, "{}: field 'data_offsets': end {} is past the data section ({} bytes)", where,
              en, data_bytes);
    const uint64_t es = dtype_size(*dtype);
    DSA_CHECK(numel <= std::numeric_limits<uint64_t>::max() / es && en - b == numel * es,
              "{}: field 'data_offsets': {} bytes for shape {} of {} (expected {})", where, en - b,
              shape_str(ti.shape), dt, numel * es);
    ti.data_begin = size_t(b);
    ti.data_end = size_t(en);
    out.push_back(std::move(ti));
  }
  // The data section must be covered exactly: no overlaps, no holes, nothing after the last tensor.
  std::vector<const TensorInfo*> by_off;
  for (const auto& t : out) by_off.push_back(&t);
  std::sort(by_off.begin(), by_off.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return a->data_begin != b->data_begin ? a->data_begin < b->data_begin : a->data_end < b->data_end;
  });
  size_t pos = 0;
  for (const TensorInfo* t : by_off) {
    DSA_CHECK(t->data_begin >= pos,
              "{}: tensor '{}': field 'data_offsets' [{}, {}) overlaps the previous tensor", origin, t->name,
              t->data_begin, t->data_end);
    DSA_CHECK(t->data_begin == pos, "{}: tensor '{}': field 'data_offsets' leaves a hole at byte {}", origin,
              t->name, pos);
    pos = t->data_end;
  }
  DSA_CHECK(pos == data_bytes, "{}: data section has {} bytes but the tensors cover {}", origin, data_bytes,
            pos);
  return out;
}

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const fs::path& path) {
  auto f = std::make_shared<SafetensorsFile>();
  f->path_ = path;
  f->map_ = std::make_shared<MappedFile>(path);
  const std::string origin = path.string();
  const size_t size = f->map_->size();
  DSA_CHECK(size >= 8, "{}: truncated: {} bytes, no header length", origin, size);
  uint64_t n;
  std::memcpy(&n, f->map_->data(), 8);
  DSA_CHECK(n <= kMaxHeaderBytes, "{}: header length {} is too large", origin, n);
  DSA_CHECK(n <= size - 8, "{}: truncated: header length {} but only {} bytes follow", origin, n, size - 8);
  const std::string header(reinterpret_cast<const char*>(f->map_->data() + 8), size_t(n));
  const size_t data_bytes = size - 8 - size_t(n);
  f->tensors_ = parse_header(header, data_bytes, origin, &f->metadata_);
  f->data_ = f->map_->data() + 8 + n;
  for (size_t i = 0; i < f->tensors_.size(); ++i) f->by_name_[f->tensors_[i].name] = i;
  return f;
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

Tensor SafetensorsFile::get(const std::string& name) const {
  const TensorInfo* t = find(name);
  DSA_CHECK(t != nullptr, "{}: no tensor '{}'", path_.string(), name);
  return Tensor::from_blob(const_cast<uint8_t*>(data_ + t->data_begin), t->shape, t->dtype, map_);
}

Checkpoint Checkpoint::open(const fs::path& path) {
  Checkpoint c;
  std::vector<fs::path> files;
  std::map<std::string, std::string> index_map;  // tensor -> file name, when sharded
  if (fs::is_regular_file(path)) {
    files.push_back(path);
  } else {
    DSA_CHECK(fs::is_directory(path), "{}: no such checkpoint file or directory", path.string());
    const fs::path index = path / "model.safetensors.index.json";
    if (fs::exists(index)) {
      json j;
      try {
        std::ifstream in(index);
        j = json::parse(in);
      } catch (const json::exception& e) {
        fail("{}: not valid JSON: {}", index.string(), e.what());
      }
      DSA_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(),
                "{}: field 'weight_map' missing or not an object", index.string());
      std::vector<std::string> names;
      for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
        DSA_CHECK(it.value().is_string(), "{}: weight_map['{}'] is not a file name", index.string(),
                  it.key());
        const std::string fname = it.value().get<std::string>();
        DSA_CHECK(fname.find('/') == std::string::npos,
                  "{}: weight_map['{}'] names a path outside the directory", index.string(), it.key());
        index_map[it.key()] = fname;
        if (std::find(names.begin(), names.end(), fname) == names.end()) names.push_back(fname);
      }
      std::sort(names.begin(), names.end());
      for (const auto& n : names) files.push_back(path / n);
    } else if (fs::exists(path / "model.safetensors")) {
      files.push_back(path / "model.safetensors");
    } else {
      for (const auto& e : fs::directory_iterator(path)) {
        if (e.path().extension() == ".safetensors" && e.path().filename() != "goldens.safetensors") {
          files.push_back(e.path());
        }
      }
      std::sort(files.begin(), files.end());
      DSA_CHECK(!files.empty(), "{}: no model.safetensors.index.json or .safetensors files", path.string());
    }
  }
  for (const auto& f : files) {
    c.files_.push_back(SafetensorsFile::open(f));
    const size_t fi = c.files_.size() - 1;
    for (const TensorInfo& t : c.files_.back()->tensors()) {
      auto [it, inserted] = c.where_.emplace(t.name, fi);
      DSA_CHECK(inserted, "tensor '{}' is in both {} and {}", t.name, c.files_[it->second]->path().string(),
                f.string());
    }
  }
  for (const auto& [name, fname] : index_map) {
    auto it = c.where_.find(name);
    DSA_CHECK(it != c.where_.end(),
              "model.safetensors.index.json lists tensor '{}' in {} but that file lacks it", name, fname);
    DSA_CHECK(c.files_[it->second]->path().filename() == fname,
              "model.safetensors.index.json puts tensor '{}' in {} but it is in {}", name, fname,
              c.files_[it->second]->path().string());
  }
  if (!index_map.empty()) {
    for (const auto& [name, fi] : c.where_) {
      DSA_CHECK(index_map.count(name) != 0, "tensor '{}' in {} is not listed in model.safetensors.index.json",
                name, c.files_[fi]->path().string());
    }
  }
  return c;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  for (const auto& [name, fi] : where_) out.push_back(name);
  return out;
}

const TensorInfo& Checkpoint::info(const std::string& name) const {
  auto it = where_.find(name);
  DSA_CHECK(it != where_.end(), "checkpoint has no tensor '{}'", name);
  return *files_[it->second]->find(name);
}

Tensor Checkpoint::get(const std::string& name) const {
  auto it = where_.find(name);
  DSA_CHECK(it != where_.end(), "checkpoint has no tensor '{}'", name);
  return files_[it->second]->get(name);
}

void write_safetensors(const fs::path& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  json h = json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  size_t off = 0;
  std::vector<Tensor> contig;
  for (const auto& [name, t] : tensors) {
    DSA_CHECK(t.device() == Device::cpu, "write_safetensors: tensor '{}' is on {}", name,
              device_name(t.device()));
    DSA_CHECK(!h.contains(name), "write_safetensors: duplicate tensor '{}'", name);
    contig.push_back(t.contiguous());
    h[name] = {{"dtype", std::string(dtype_safetensors_name(t.dtype()))},
               {"shape", t.shape()},
               {"data_offsets", {off, off + t.nbytes()}}};
    off += t.nbytes();
  }
  std::string header = h.dump();
  header.append((8 - header.size() % 8) % 8, ' ');
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    DSA_CHECK(out.good(), "{}: cannot write", tmp.string());
    const uint64_t n = header.size();
    out.write(reinterpret_cast<const char*>(&n), 8);
    out.write(header.data(), std::streamsize(header.size()));
    for (const Tensor& t : contig)
      out.write(static_cast<const char*>(t.raw_data()), std::streamsize(t.nbytes()));
    DSA_CHECK(out.good(), "{}: write failed", tmp.string());
  }
  fs::rename(tmp, path);
}

}  // namespace dsaserve::io
