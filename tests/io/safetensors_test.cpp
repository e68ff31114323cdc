#include "io/safetensors.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>
#include <random>

#include "common/fixtures.h"

namespace dsaserve::io {
namespace {

namespace fs = std::filesystem;

fs::path temp_path(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("dsaserve_io_test_{}", ::getpid());
  fs::create_directories(dir);
  return dir / name;
}

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_all(const fs::path& p, const std::string& s) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(s.data(), std::streamsize(s.size()));
}

// A file with a raw header string and `data_bytes` bytes of data.
std::string make_file(const std::string& header, size_t data_bytes) {
  std::string s(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(s.data(), &n, 8);
  s += header;
  s.append(data_bytes, '\x11');
  return s;
}

TEST(Safetensors, WriteThenReadRoundTrips) {
  Tensor a = Tensor::from_vector({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = a.to(DType::bf16);
  Tensor ids = Tensor::zeros({5}, DType::i32);
  ids.data<int32_t>()[3] = 42;
  const fs::path p = temp_path("rt.safetensors");
  write_safetensors(p, {{"a", a}, {"b.t", b.transpose(0, 1)}, {"ids", ids}}, {{"format", "pt"}});
  auto f = SafetensorsFile::open(p);
  EXPECT_EQ(f->tensors().size(), 3u);
  EXPECT_EQ(f->metadata().at("format"), "pt");
  EXPECT_EQ(f->get("a").to_f32_vector(), a.to_f32_vector());
  Tensor bt = f->get("b.t");
  EXPECT_EQ(bt.dtype(), DType::bf16);
  EXPECT_EQ(bt.shape(), (Shape{3, 2}));
  EXPECT_EQ(bt.item_f32(1), 4.0f);
  EXPECT_EQ(f->get("ids").data<int32_t>()[3], 42);
  EXPECT_THROW(f->get("nope"), Error);
  // The view outlives the file object.
  Tensor keep = f->get("a");
  f.reset();
  EXPECT_EQ(keep.item_f32(5), 6.0f);
}

TEST(Safetensors, RejectsBadHeadersWithTheFieldNamed) {
  struct Case {
    std::string header;
    size_t data;
    std::string expect;  // substring of the error
  };
  const std::vector<Case> cases = {
      {"not json", 0, "not valid JSON"},
      {"[1,2]", 0, "not a JSON object"},
      {R"({"t":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", 8, "unsupported dtype 'F64'"},
      {R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", 4, "field 'data_offsets'"},
      {R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 2, "past the data section"},
      {R"({"t":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4, "field 'shape'"},
      {R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", 4, "begin 4 > end 0"},
      {R"({"t":{"dtype":"F32","shape":[1]}})", 4, "'data_offsets' missing"},
      {R"({"t":{"shape":[1],"data_offsets":[0,4]}})", 4, "'dtype' missing"},
      {R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1}})", 4, "unknown field 'x'"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
       8, "overlaps"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8, "hole"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 8, "cover 4"},
      {R"({"a":{"dtype":"U8","shape":[4294967296,4294967296,16],"data_offsets":[0,4]}})", 4, "overflows"},
      {R"({"__metadata__":{"k":1}})", 0, "__metadata__.k"},
  };
  for (const Case& c : cases) {
    const fs::path p = temp_path("bad.safetensors");
    write_all(p, make_file(c.header, c.data));
    try {
      SafetensorsFile::open(p);
      ADD_FAILURE() << "accepted: " << c.header;
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(c.expect), std::string::npos) << msg;
      EXPECT_NE(msg.find("bad.safetensors"), std::string::npos) << msg;  // names the file
    }
  }
}

TEST(Safetensors, RejectsTruncatedFiles) {
  Tensor a = Tensor::from_vector({1, 2, 3, 4}, {4});
  const fs::path good = temp_path("good.safetensors");
  write_safetensors(good, {{"a", a}});
  const std::string bytes = read_all(good);
  for (size_t n = 0; n < bytes.size(); ++n) {
    const fs::path p = temp_path("trunc.safetensors");
    write_all(p, bytes.substr(0, n));
    EXPECT_THROW(SafetensorsFile::open(p), Error) << "length " << n;
  }
}

// issue 19: a FIFO would block open() until a writer came; it (and any non-regular file) is refused.
TEST(Safetensors, RejectsFifosWithoutBlocking) {
  const fs::path p = temp_path("fifo.safetensors");
  fs::remove(p);
  ASSERT_EQ(::mkfifo(p.c_str(), 0600), 0);
  try {
    SafetensorsFile::open(p);
    FAIL() << "a FIFO opened";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a regular file"), std::string::npos) << e.what();
  }
  EXPECT_THROW(SafetensorsFile::open("/dev/null"), Error);
  fs::remove(p);
}

// Randomised corruption of real headers: every mutated file either opens with a consistent index or
// throws dsaserve::Error; nothing crashes (run under sanitizers by scripts/sanitize.sh).
TEST(Safetensors, RandomCorruptionNeverCrashes) {
  Tensor a = Tensor::from_vector({1, 2, 3, 4, 5, 6, 7, 8}, {2, 4});
  const fs::path good = temp_path("fuzz_src.safetensors");
  write_safetensors(good, {{"a", a}, {"b", a.to(DType::bf16)}, {"c", a.to(DType::f8e4m3fn)}}, {{"m", "v"}});
  const std::string bytes = read_all(good);
  std::mt19937 rng(7);
  const std::string interesting = "{}[]\":,0123456789-eE. FUI_x";
  int accepted = 0, rejected = 0;
  for (int iter = 0; iter < 4000; ++iter) {
    std::string s = bytes;
    const int edits = 1 + int(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const size_t pos = rng() % s.size();
      switch (rng() % 4) {
        case 0: s[pos] = char(rng()); break;
        case 1: s[pos] = interesting[rng() % interesting.size()]; break;
        case 2: s.erase(pos, 1 + rng() % 4); break;
        case 3: s.insert(pos, 1, interesting[rng() % interesting.size()]); break;
      }
      if (s.empty()) s = "x";
    }
    const fs::path p = temp_path("fuzz.safetensors");
    write_all(p, s);
    try {
      auto f = SafetensorsFile::open(p);
      for (const TensorInfo& t : f->tensors()) {
        Tensor v = f->get(t.name);
        ASSERT_EQ(v.nbytes(), t.data_end - t.data_begin);
        ASSERT_LE(t.data_end + 8, s.size());
      }
      ++accepted;
    } catch (const Error&) {
      ++rejected;
    }
  }
  EXPECT_GT(rejected, 1000);
  RecordProperty("accepted", accepted);
}

TEST(Checkpoint, LoadsShardedAndSingleFixtures) {
  DSA_FIXTURE_PATH(models, "models");
  for (const char* name : {"tiny", "realdims", "realdims_fp8"}) {
    const Checkpoint c = Checkpoint::open(models / name);
    EXPECT_GT(c.names().size(), 100u) << name;
    const Tensor emb = c.get("model.embed_tokens.weight");
    EXPECT_EQ(emb.dtype(), DType::bf16);
    EXPECT_EQ(emb.dim(), 2);
  }
  const Checkpoint rd = Checkpoint::open(models / "realdims");
  EXPECT_EQ(rd.files().size(), 3u);
  const Checkpoint fp8 = Checkpoint::open(models / "realdims_fp8");
  EXPECT_EQ(fp8.info("model.layers.1.self_attn.kv_b_proj.weight").dtype, DType::f8e4m3fn);
  EXPECT_EQ(fp8.get("model.layers.1.self_attn.kv_b_proj.weight_scale_inv").shape(), (Shape{14, 4}));
}

TEST(Checkpoint, IndexMismatchesAreErrors) {
  const fs::path dir = temp_path("sharded");
  fs::create_directories(dir);
  write_safetensors(dir / "part1.safetensors", {{"a", Tensor::from_vector({1}, {1})}});
  write_all(dir / "model.safetensors.index.json",
            R"({"weight_map": {"a": "part1.safetensors", "b": "part1.safetensors"}})");
  try {
    Checkpoint::open(dir);
    ADD_FAILURE() << "accepted an index naming a missing tensor";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'b'"), std::string::npos) << e.what();
  }
  write_all(dir / "model.safetensors.index.json", R"({"weight_map": {"a": "../x.safetensors"}})");
  EXPECT_THROW(Checkpoint::open(dir), Error);
  EXPECT_THROW(Checkpoint::open(dir / "nonexistent"), Error);
}

}  // namespace
}  // namespace dsaserve::io
