#include "cohort/nn/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

namespace cohort::nn {

namespace {

// safetensors spells our dtype names in capitals: F32, BF16, F16, I64, U8.
std::string st_dtype(DType t) {
  std::string s = tensor::dtype_name(t);
  for (char& ch : s) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  return s;
}

bool parse_st_dtype(const std::string& s, DType* t) {
  for (DType d : {DType::f32, DType::bf16, DType::f16, DType::i64, DType::u8}) {
    if (st_dtype(d) == s) {
      *t = d;
      return true;
    }
  }
  return false;
}

}  // namespace

void write_stream_atomically(const std::string& path,
                             const std::function<void(const ByteSink&)>& produce,
                             const VerifyFile& verify) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  std::error_code ec;
  const bool existed = std::filesystem::exists(path, ec);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) COHORT_THROW("cannot create " << tmp << ": " << errno_string(errno));
  auto fail = [&](const char* what) {
    const int err = errno;
    COHORT_THROW(what << " " << tmp << " (for " << path << "): " << errno_string(err)
                      << (existed ? "; the previous " + path + " is untouched" : std::string()));
  };
  const ByteSink sink = [&](const void* data, size_t len) {
    const char* p = static_cast<const char*>(data);
    while (len > 0) {
      const ssize_t w = ::write(fd, p, len);
      if (w < 0) {
        if (errno == EINTR) continue;
        fail("writing");
      }
      p += w;
      len -= static_cast<size_t>(w);
    }
  };
  try {
    produce(sink);
    if (::fsync(fd) != 0) fail("flushing");
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (::close(fd) != 0) {
    ::unlink(tmp.c_str());
    COHORT_THROW("closing " << tmp << ": " << errno_string(errno));
  }
  if (verify) {
    try {
      verify(tmp);
    } catch (...) {
      ::unlink(tmp.c_str());
      throw;
    }
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    COHORT_THROW("renaming " << tmp << " to " << path << ": " << errno_string(err));
  }
  // The rename itself must reach the disk.
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

void write_file_atomically(const std::string& path,
                           const std::vector<std::pair<const void*, size_t>>& parts,
                           const VerifyFile& verify) {
  write_stream_atomically(
      path,
      [&](const ByteSink& sink) {
        for (auto& [ptr, len] : parts) sink(ptr, len);
      },
      verify);
}

void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata,
                      const VerifyFile& verify) {
  nlohmann::json header = nlohmann::json::object();
  std::vector<Tensor> dense;
  size_t offset = 0;
  for (auto& [name, t] : tensors) {
    Tensor c = t.contiguous();
    header[name] = {{"dtype", st_dtype(c.dtype())},
                    {"shape", c.shape()},
                    {"data_offsets", {offset, offset + c.bytes()}}};
    offset += c.bytes();
    dense.push_back(c);
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the format pads the header to 8 bytes
  const uint64_t n = text.size();
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(n >> (8 * i));
  std::vector<std::pair<const void*, size_t>> parts{{len, 8}, {text.data(), text.size()}};
  for (const Tensor& t : dense) parts.emplace_back(t.raw(), t.bytes());
  write_file_atomically(path, parts, verify);
}

SafeTensors load_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) COHORT_THROW("cannot open weights file " << path << ": " << errno_string(errno));
  in.seekg(0, std::ios::end);
  const uint64_t size = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  COHORT_CHECK(size >= 8, path << ": " << size << " bytes is too short for a safetensors file");
  uint8_t len[8];
  in.read(reinterpret_cast<char*>(len), 8);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(len[i]) << (8 * i);
  COHORT_CHECK(n <= size - 8 && n <= (100u << 20),
               path << ": header of " << n << " bytes does not fit in the file of " << size
                    << " bytes (not safetensors, or truncated)");
  std::string text(n, '\0');
  in.read(text.data(), static_cast<std::streamsize>(n));
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    COHORT_THROW(path << ": malformed safetensors header: " << e.what());
  }
  COHORT_CHECK(header.is_object(), path << ": safetensors header is not a JSON object");
  const uint64_t data_size = size - 8 - n;
  SafeTensors out;
  for (auto& [name, e] : header.items()) {
    if (name == "__metadata__") {
      for (auto& [k, v] : e.items())
        if (v.is_string()) out.metadata[k] = v.get<std::string>();
      continue;
    }
    DType t;
    try {
      COHORT_CHECK(parse_st_dtype(e.at("dtype").get<std::string>(), &t),
                   path << ": tensor " << name << " has unsupported dtype " << e.at("dtype"));
      const Shape shape = e.at("shape").get<Shape>();
      const auto off = e.at("data_offsets").get<std::vector<uint64_t>>();
      COHORT_CHECK(off.size() == 2 && off[0] <= off[1],
                   path << ": tensor " << name << " has bad data_offsets");
      // The element count, checked against the data section as it grows: a shape such as
      // [2^40, 2^40] would otherwise overflow and pass the size check below.
      uint64_t numel = 1;
      for (int64_t d : shape) {
        COHORT_CHECK(d >= 0, path << ": tensor " << name << " has a negative dimension " << d);
        COHORT_CHECK(d == 0 || numel <= data_size / static_cast<uint64_t>(d),
                     path << ": tensor " << name << " has shape " << tensor::shape_string(shape)
                          << ", more elements than the " << data_size
                          << " bytes of the data section hold");
        numel *= static_cast<uint64_t>(d);
      }
      const uint64_t want = numel * tensor::dtype_size(t);
      COHORT_CHECK(off[1] - off[0] == want, path << ": tensor " << name << " spans "
                                                 << off[1] - off[0] << " bytes but its shape "
                                                 << tensor::shape_string(shape) << " needs "
                                                 << want);
      COHORT_CHECK(off[1] <= data_size, path << ": truncated: tensor " << name
                                             << " needs bytes up to " << off[1]
                                             << " of the data section, which has " << data_size);
      Tensor v = Tensor::empty(shape, t);
      in.seekg(static_cast<std::streamoff>(8 + n + off[0]));
      in.read(static_cast<char*>(v.raw()), static_cast<std::streamsize>(want));
      COHORT_CHECK(in.good(), path << ": read of tensor " << name << " failed");
      out.tensors.emplace(name, std::move(v));
    } catch (const nlohmann::json::exception& ex) {
      COHORT_THROW(path << ": malformed entry " << name << ": " << ex.what());
    }
  }
  return out;
}

void save_weights(const Model& m, const std::string& path,
                  const std::map<std::string, std::string>& metadata) {
  NamedTensors ts;
  for (Param* p : m.params()) ts.emplace_back(p->name, p->value);
  for (Buffer* b : m.buffers()) ts.emplace_back(b->name, b->value);
  auto meta = metadata;
  meta["model"] = m.name();
  meta["format"] = "pt";
  save_safetensors(path, ts, meta);
}

void load_weights(Model& m, const std::string& path) {
  SafeTensors st = load_safetensors(path);
  std::vector<std::pair<std::string, Tensor*>> targets;
  for (Param* p : m.params()) targets.emplace_back(p->name, &p->value);
  for (Buffer* b : m.buffers()) targets.emplace_back(b->name, &b->value);
  std::string missing;
  for (auto& [name, dst] : targets) {
    auto it = st.tensors.find(name);
    if (it == st.tensors.end()) {
      if (missing.size() < 200) missing += (missing.empty() ? "" : ", ") + name;
      continue;
    }
    const Tensor& src = it->second;
    COHORT_CHECK(src.shape() == dst->shape(), path << ": " << name << " has shape "
                                                   << tensor::shape_string(src.shape())
                                                   << ", the model (" << m.name() << ") wants "
                                                   << tensor::shape_string(dst->shape()));
    dst->copy_(src);
    st.tensors.erase(it);
  }
  COHORT_CHECK(missing.empty(), path << ": missing for " << m.name() << ": " << missing);
  if (!st.tensors.empty()) {
    std::string extra;
    for (auto& [name, t] : st.tensors)
      if (extra.size() < 200) extra += (extra.empty() ? "" : ", ") + name;
    COHORT_THROW(path << ": entries " << m.name() << " does not have: " << extra);
  }
}

}  // namespace cohort::nn
