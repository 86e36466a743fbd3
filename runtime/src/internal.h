// Internal declarations of libforgekit_runtime: the metadata, the host checks and the decryption.
#ifndef FORGEKIT_RUNTIME_INTERNAL_H_
#define FORGEKIT_RUNTIME_INTERNAL_H_

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace forgekit {

// A user-facing failure: one line and a forgekit exit code (fk_status).
struct Failure : std::runtime_error {
  int code;
  Failure(int code, const std::string& message) : std::runtime_error(message), code(code) {}
};

// One input or output as metadata.json describes it; -1 marks a dynamic dim.
struct TensorSpec {
  std::string name, dtype;
  std::vector<int64_t> shape, dim_min, dim_max, dim_step;
  std::vector<std::string> symbols;   // "" for static dims
  std::vector<const char*> symbol_ptrs;  // what fk_tensor_info.dim_names points to
};

struct Variant {  // one instruction-set level of a portable artifact
  std::string name, file;
  std::vector<std::string> cpu_features;
  int64_t size = -1;  // bytes, as metadata.json records them (-1: not recorded)
  std::string sha256;  // hex, as metadata.json records it ("": not recorded)
};

struct Metadata {
  std::string layout, library_file, arch, cpu, target_name, device_os = "linux", device_kind = "cpu";
  // a CUDA artifact's GPU (build.device): "sm_90", "Hopper", the CUDA release "13.0", the driver branch "580"
  std::string gpu_arch, gpu_generation, cuda, min_driver;
  std::vector<std::string> cpu_features;
  std::vector<Variant> variants;
  int64_t library_size = -1;  // of library_file (-1: not recorded)
  std::string library_sha256, weights_file, weights_sha256;  // "": not recorded
  std::vector<TensorSpec> inputs, outputs;
};

// metadata.json parsed (Failure with FK_ERR_ARTIFACT when unreadable).
Metadata ReadMetadata(const std::string& path);

// Failure (FK_ERR_INCOMPATIBLE / FK_ERR_NOT_AVAILABLE) unless this machine can run the artifact's host code (a
// CUDA artifact's GPU is checked when its CUDA runtime is loaded: forgekit_runtime.cc).
void CheckRunnable(const Metadata& meta, const std::string& what);
// The GPU a CUDA artifact needs, as forgekit.artifact.layout.describe_device says it: "an NVIDIA GPU sm_90
// (Hopper) with a CUDA 13.0 driver (R580 or newer)".
std::string DescribeGpu(const Metadata& meta);
// The library file (within dir) this CPU runs best, and its level name ("" for single-level artifacts).
std::pair<std::string, std::string> ChooseLibrary(const Metadata& meta, const std::string& dir,
                                                  const std::string& library);
// Failure (FK_ERR_ARTIFACT) when the library is not the size metadata.json records (truncated, partly copied):
// forgekit.runtime.compat.check_size.
void CheckSize(const Metadata& meta, const std::string& library);

// Failure (FK_ERR_ARTIFACT) when the library (or the weights file its levels share) does not hash to the sha256
// metadata.json records: forgekit.runtime.integrity.  Needs libcrypto; a runtime built without it skips the check.
void CheckDigests(const Metadata& meta, const std::string& library, bool shared_weights);
// The path to dlopen `library` with: another spelling once the file at that path was replaced, so glibc does
// not hand back the code loaded from the old file (forgekit.runtime.integrity.load_path); "" when the file was
// overwritten in place (same inode) since: then load a copy from memory (CopyToMemfd).
std::string LoadPath(const std::string& library);
int CopyToMemfd(const std::string& path);

// The SHA-256 of a file as lowercase hex; "" when this runtime was built without libcrypto.
std::string Sha256File(const std::string& path);
// True when the file starts with the encrypted-library magic bytes.
bool IsEncrypted(const std::string& path);
// Decrypt and authenticate every chunk into a sealed memfd; returns its descriptor (caller closes).
int DecryptToMemfd(const std::string& library, const std::string& key_file, const std::string& password);

std::string JoinPath(const std::string& dir, const std::string& name);
bool FileExists(const std::string& path);

}  // namespace forgekit

#endif  // FORGEKIT_RUNTIME_INTERNAL_H_
