#pragma once
// safetensors checkpoints: mmap'd, validated headers, zero-copy tensor views.
// A Checkpoint is one .safetensors file or a directory with model.safetensors.index.json (sharded) or a
// single model.safetensors. Views keep their file mapping alive.
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace dsaserve::io {

struct TensorInfo {
  std::string name;
  DType dtype;
  Shape shape;
  size_t data_begin = 0;  // byte offsets relative to the start of the data section
  size_t data_end = 0;
};

class MappedFile;

// One .safetensors file. open() validates the whole header (JSON shape, dtype names, offsets inside the
// file, no overlaps or gaps, byte size == shape x dtype size) and throws dsaserve::Error naming the file,
// tensor and field at fault.
class SafetensorsFile {
 public:
  static std::shared_ptr<SafetensorsFile> open(const std::filesystem::path& path);
  // Parses a header from memory (no mapping); used by open() and the corruption tests.
  static std::vector<TensorInfo> parse_header(const std::string& json_text, size_t data_bytes,
                                              const std::string& origin,
                                              std::map<std::string, std::string>* metadata = nullptr);

  const std::filesystem::path& path() const { return path_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const TensorInfo* find(const std::string& name) const;
  Tensor get(const std::string& name) const;  // zero-copy CPU view

 private:
  std::filesystem::path path_;
  std::shared_ptr<MappedFile> map_;
  const uint8_t* data_ = nullptr;  // start of the data section
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> by_name_;
  std::map<std::string, std::string> metadata_;
};

class Checkpoint {
 public:
  // `path`: a directory (index.json or model.safetensors inside) or a .safetensors file.
  static Checkpoint open(const std::filesystem::path& path);

  std::vector<std::string> names() const;  // sorted
  bool contains(const std::string& name) const { return where_.count(name) != 0; }
  const TensorInfo& info(const std::string& name) const;
  Tensor get(const std::string& name) const;  // throws naming the tensor when absent
  const std::vector<std::shared_ptr<SafetensorsFile>>& files() const { return files_; }

 private:
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t> where_;  // tensor -> file index
};

// Writes tensors (any device-CPU dtype, contiguous or not) to a .safetensors file.
void write_safetensors(const std::filesystem::path& path,
                       const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace dsaserve::io
