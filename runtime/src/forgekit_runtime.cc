// The forgekit runtime C API over the TVM runtime (what forgekit/runtime/engine.py does, in C++): load the
// model library as a tvm::ffi::Module, make its Relax VM (vm_load_executable, vm_initialization) and call
// its "main" on tvm::ffi::Tensors.  A CUDA model also loads TVM's CUDA runtime (libtvm_runtime_cuda.so) first,
// makes the VM on the GPU and moves host inputs and outputs across with the TVM runtime's copy functions.
#include "../include/forgekit_runtime.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <climits>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <tvm/ffi/container/array.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/module.h>
#include <tvm/ffi/function.h>
#include <vector>

#include "internal.h"

namespace forgekit {

std::string JoinPath(const std::string& dir, const std::string& name) {
  return dir.empty() || dir.back() == '/' ? dir + name : dir + "/" + name;
}

bool FileExists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

namespace {

thread_local std::string g_last_error;
// how the message of a refused index starts (forgekit.errors.INDEX_ERROR_MARKER)
const char kIndexErrorMarker[] = "Index out of range";
// how TVM's VM words a failed run-time shape check (forgekit.runtime.engine.SHAPE_CHECK)
const char kShapeCheck[] = "match_cast error";

struct DtypeName {
  const char* name;
  DLDataType type;
};
const DtypeName kDtypes[] = {
    {"float32", {kDLFloat, 32, 1}}, {"float16", {kDLFloat, 16, 1}}, {"float64", {kDLFloat, 64, 1}},
    {"bfloat16", {kDLBfloat, 16, 1}}, {"int8", {kDLInt, 8, 1}},     {"int16", {kDLInt, 16, 1}},
    {"int32", {kDLInt, 32, 1}},     {"int64", {kDLInt, 64, 1}},     {"uint8", {kDLUInt, 8, 1}},
    {"uint16", {kDLUInt, 16, 1}},   {"uint32", {kDLUInt, 32, 1}},   {"uint64", {kDLUInt, 64, 1}},
    {"bool", {kDLBool, 8, 1}},
};

const DtypeName* FindDtype(const std::string& name) {
  for (const DtypeName& d : kDtypes) {
    if (name == d.name) return &d;
  }
  return nullptr;
}

const char* DtypeOf(DLDataType t) {
  for (const DtypeName& d : kDtypes) {
    if (d.type.code == t.code && d.type.bits == t.bits && d.type.lanes == t.lanes) return d.name;
  }
  return "unknown";
}

// TVM's kernels assume 64-byte aligned buffers; an unaligned one crashes without a message.
struct AlignedAlloc {
  void AllocData(DLTensor* t) {
    size_t bytes = tvm::ffi::GetDataSize(*t);
    if (posix_memalign(&t->data, 64, bytes ? bytes : 64) != 0) t->data = nullptr;
  }
  void FreeData(DLTensor* t) { free(t->data); }
};

std::string Shape(const std::vector<int64_t>& shape, const std::vector<std::string>* symbols = nullptr) {
  std::string out;
  for (size_t i = 0; i < shape.size(); ++i) {
    out += (i ? "x" : "") + (shape[i] < 0 && symbols ? (*symbols)[i] : std::to_string(shape[i]));
  }
  return out.empty() ? "scalar" : out;
}

std::string FirstLine(const std::string& text) {
  std::string line = text.substr(0, text.find('\n'));
  return line.empty() ? "unknown error" : line;
}

// The model library refers to libtvm_ffi's C symbols; when this library was itself dlopen()ed with
// RTLD_LOCAL (ctypes, JNI, a plugin host) they are invisible to it.  Re-opening both TVM libraries with
// RTLD_GLOBAL | RTLD_NOLOAD makes them global without loading anything new.  TopK and Sort kernels call
// tvm.contrib.sort.*, which TVM builds into libtvm_runtime_extra.so next to libtvm_runtime.so: loaded when it
// is there (forgekit/runtime/loader.py does the same), a model without them runs without it.
void PromoteTvmLibraries() {
  void* runtime = dlsym(RTLD_DEFAULT, "TVMBackendAllocWorkspace");
  for (void* symbol : {reinterpret_cast<void*>(&TVMFFIFunctionGetGlobal), runtime}) {
    Dl_info info;
    if (symbol && dladdr(symbol, &info) && info.dli_fname) dlopen(info.dli_fname, RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD);
  }
  Dl_info info;
  if (runtime && dladdr(runtime, &info) && info.dli_fname) {
    std::string path = info.dli_fname;
    size_t slash = path.rfind('/');
    std::string extra = (slash == std::string::npos ? std::string() : path.substr(0, slash + 1)) +
                        "libtvm_runtime_extra.so";
    if (FileExists(extra)) dlopen(extra.c_str(), RTLD_NOW | RTLD_GLOBAL);
  }
}

// glibc's dlopen returns an already-loaded object when the path string matches one loaded before, so each
// memfd load spells /proc/self/fd/N differently ("./" and ".//" segments for the bits of a counter).
std::string FdPath(int fd) {
  static std::atomic<unsigned> counter{0};
  unsigned n = counter++;
  std::string segments;
  do {
    segments.insert(0, (n & 1) ? ".//" : "./");
    n >>= 1;
  } while (n);
  return "/proc/self/fd/" + segments + std::to_string(fd);
}

// Copies a C-contiguous tensor on a device into it from host memory, or from it into host memory, and
// synchronizes (the TVM runtime's global functions: the CUDA DeviceAPI is reached through them, not linked).
void CopyFromHost(const tvm::ffi::Tensor& to, const void* data, size_t bytes) {
  static tvm::ffi::Function copy = tvm::ffi::Function::GetGlobalRequired("runtime.TVMTensorCopyFromBytes");
  copy(to, const_cast<void*>(data), bytes);
}
void CopyToHost(const tvm::ffi::Tensor& from, void* data, size_t bytes) {
  static tvm::ffi::Function copy = tvm::ffi::Function::GetGlobalRequired("runtime.TVMTensorCopyToBytes");
  copy(from, data, bytes);
}

// The directory of the loaded library that defines `symbol` ("" when none does).
std::string DirOf(void* symbol) {
  Dl_info info;
  if (!symbol || !dladdr(symbol, &info) || !info.dli_fname) return "";
  std::string path = info.dli_fname;
  size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? "" : path.substr(0, slash);
}

const char kCudaRuntime[] = "libtvm_runtime_cuda.so";

// Loads TVM's CUDA runtime once per process, with RTLD_GLOBAL: it registers the CUDA device API and the loader
// of the kernels a CUDA model library carries (ffi.Module.load_from_bytes.cuda), which must exist before the
// model library is loaded.  It needs libcudart.so.13 and the driver's libcuda.so.1; when either is missing the
// dlopen fails, and that becomes one line saying what this machine lacks.
void LoadCudaRuntime(const forgekit::Metadata& meta, const std::string& what, const char* explicit_path) {
  static std::mutex lock;
  static void* handle = nullptr;  // never closed: the functions it registered stay registered
  std::lock_guard<std::mutex> guard(lock);
  if (handle) return;
  std::string path = kCudaRuntime;  // when found nowhere below: LD_LIBRARY_PATH, ld.so.cache
  if (explicit_path && *explicit_path) {
    path = explicit_path;
  } else if (const char* env = getenv("FORGEKIT_TVM_RUNTIME_CUDA"); env && *env) {
    path = env;
  } else {
    // next to libtvm_runtime.so (the apache-tvm wheel's tvm/lib), then next to this library (a bundle's
    // runtime/ folder); found by soname, so this works when this library was loaded RTLD_LOCAL too
    void* tvm = dlopen("libtvm_runtime.so", RTLD_NOW | RTLD_NOLOAD);
    std::string tvm_dir = DirOf(tvm ? dlsym(tvm, "TVMBackendAllocWorkspace") : nullptr);
    if (tvm) dlclose(tvm);  // only the reference NOLOAD took
    std::string own_dir = DirOf(reinterpret_cast<void*>(&fk_open_ex));
    for (const std::string& dir : {own_dir, tvm_dir}) {  // the last found wins: libtvm_runtime.so's folder
      if (!dir.empty() && forgekit::FileExists(forgekit::JoinPath(dir, kCudaRuntime))) {
        path = forgekit::JoinPath(dir, kCudaRuntime);
      }
    }
  }
  handle = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
  if (handle) return;
  const char* raw = dlerror();
  std::string error = raw ? raw : "unknown dlopen error";
  std::string needs = what + " is a CUDA artifact: it needs " + forgekit::DescribeGpu(meta);
  if (path == kCudaRuntime && error.find(kCudaRuntime) != std::string::npos && error.find("No such file") !=
      std::string::npos) {
    throw Failure(FK_ERR_NOT_AVAILABLE, needs + " and TVM's CUDA runtime " + kCudaRuntime + ", which is not next "
                  "to libtvm_runtime.so nor on the library path: copy it there or set FORGEKIT_TVM_RUNTIME_CUDA.");
  }
  if (error.find("libcuda.so") != std::string::npos) {
    throw Failure(FK_ERR_NOT_AVAILABLE, needs + "; none found here (no NVIDIA driver: " + error + ").");
  }
  if (error.find("libcudart.so") != std::string::npos) {
    throw Failure(FK_ERR_NOT_AVAILABLE, needs + " and NVIDIA's CUDA runtime libcudart.so.13 (the "
                  "nvidia-cuda-runtime wheel or the CUDA toolkit: add its lib/ to LD_LIBRARY_PATH); " + error + ".");
  }
  throw Failure(FK_ERR_NOT_AVAILABLE, needs + "; TVM's CUDA runtime '" + path + "' cannot be loaded: " + error + ".");
}

// Refuses a CUDA device that is not there or older than the artifact's GPU architecture (its kernels are SASS
// for that architecture plus PTX the driver compiles for newer GPUs, nothing for older ones).
void CheckCudaDevice(const forgekit::Metadata& meta, const std::string& what, int32_t id) {
  static tvm::ffi::Function attr = tvm::ffi::Function::GetGlobalRequired("runtime.GetDeviceAttr");
  std::string needs = what + " is a CUDA artifact: it needs " + forgekit::DescribeGpu(meta);
  int64_t exists = 0;
  try {
    exists = attr(static_cast<int>(kDLCUDA), id, 0 /* kExist */).cast<int64_t>();
  } catch (const tvm::ffi::Error& e) {  // the driver is there but cannot start (no GPU, a driver too old)
    throw Failure(FK_ERR_NOT_AVAILABLE, needs + "; the CUDA driver found none: " + FirstLine(e.message()));
  }
  if (!exists) {
    throw Failure(FK_ERR_NOT_AVAILABLE, needs + "; CUDA device " + std::to_string(id) + " does not exist here.");
  }
  auto version = attr(static_cast<int>(kDLCUDA), id, 4 /* kComputeVersion */).try_cast<tvm::ffi::String>();
  int major = 0, minor = 0, arch = 0;
  if (version && sscanf(std::string(*version).c_str(), "%d.%d", &major, &minor) == 2 &&
      sscanf(meta.gpu_arch.c_str(), "sm_%d", &arch) == 1 && major * 10 + minor < arch) {
    throw Failure(FK_ERR_INCOMPATIBLE, needs + "; CUDA device " + std::to_string(id) + " is sm_" +
                                           std::to_string(major * 10 + minor) + ": recompile for -t cuda/sm_" +
                                           std::to_string(major * 10 + minor) + ".");
  }
}

}  // namespace

// A sealed anonymous memory file holding a copy of the file at `path` (caller closes it).
int CopyToMemfd(const std::string& path) {
  int in = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (in < 0) throw Failure(FK_ERR_ARTIFACT, "Cannot read '" + path + "': check its permissions.");
  int fd = memfd_create("forgekit-model", MFD_CLOEXEC);
  char block[1 << 16];
  ssize_t got = 0;
  while (fd >= 0 && (got = read(in, block, sizeof block)) > 0) {
    for (ssize_t done = 0; done < got;) {
      ssize_t wrote = write(fd, block + done, static_cast<size_t>(got - done));
      if (wrote <= 0) {
        got = -1;
        break;
      }
      done += wrote;
    }
    if (got < 0) break;
  }
  close(in);
  if (fd < 0 || got < 0) {
    if (fd >= 0) close(fd);
    throw Failure(FK_ERR_ARTIFACT, "Cannot copy '" + path + "' into memory to load it again.");
  }
  return fd;
}

// glibc's dlopen also returns the object loaded before under the same path when the file there was replaced
// since (an artifact recompiled in place): each file identity (device, inode, size, mtime) seen at a path gets
// its own spelling, "dir/./name", "dir/././name"... (a portable level still finds its weights next to it).
std::string LoadPath(const std::string& library) {
  static std::mutex lock;
  static std::map<std::string, std::map<std::vector<int64_t>, std::string>> spellings;
  char resolved[PATH_MAX];
  std::string real = realpath(library.c_str(), resolved) ? resolved : library;
  struct stat st;
  if (stat(real.c_str(), &st) != 0) return library;
  std::vector<int64_t> id = {static_cast<int64_t>(st.st_dev), static_cast<int64_t>(st.st_ino),
                             static_cast<int64_t>(st.st_size), static_cast<int64_t>(st.st_mtim.tv_sec),
                             static_cast<int64_t>(st.st_mtim.tv_nsec)};
  std::lock_guard<std::mutex> guard(lock);
  auto& seen = spellings[real];
  auto found = seen.find(id);
  if (found != seen.end()) return found->second;
  for (const auto& entry : seen) {
    // the same inode with other bytes (cp onto it): dlopen would hand back the old code under any name
    if (entry.first[0] == id[0] && entry.first[1] == id[1]) return "";
  }
  size_t slash = real.find_last_of('/');
  std::string dots;
  for (size_t i = 0; i < seen.size(); ++i) dots += "./";
  return seen[id] = real.substr(0, slash + 1) + dots + real.substr(slash + 1);
}

namespace {

tvm::ffi::Module LoadLibrary(const std::string& path) {
  // Not Module::LoadFromFile: it picks the loader from the extension, and a memfd path has none.
  static tvm::ffi::Function loader = tvm::ffi::Function::GetGlobalRequired("ffi.Module.load_from_file.so");
  return loader(path, "so").cast<tvm::ffi::Module>();
}

void Flatten(const tvm::ffi::Any& value, std::vector<tvm::ffi::Tensor>* out) {
  if (auto tensor = value.try_cast<tvm::ffi::Tensor>()) {
    out->push_back(*tensor);
  } else if (auto items = value.try_cast<tvm::ffi::Array<tvm::ffi::Any>>()) {
    for (const tvm::ffi::Any& item : *items) Flatten(item, out);
  } else {
    throw Failure(FK_ERR_RUNTIME, std::string("The model returned a ") + value.GetTypeKey() +
                                      ", not tensors: this runtime returns tensor outputs only.");
  }
}

}  // namespace
}  // namespace forgekit

using forgekit::Failure;

struct fk_model {
  forgekit::Metadata meta;
  std::string level;
  tvm::ffi::Module library{tvm::ffi::UnsafeInit()};  // keeps the code loaded as long as the VM lives
  tvm::ffi::Module vm{tvm::ffi::UnsafeInit()};
  tvm::ffi::Function main;
  DLDevice device{kDLCPU, 0};
  std::vector<std::optional<tvm::ffi::Tensor>> inputs;  // std::optional: value() is a reference, not a copy
  std::vector<bool> borrowed;  // the input wraps the caller's memory (fk_set_input_device): never written to
  std::vector<tvm::ffi::Tensor> outputs;                 // where the model computed them
  std::vector<std::optional<tvm::ffi::Tensor>> host_outputs;  // a GPU model's outputs, copied on first request
  std::vector<std::vector<int64_t>> output_shapes;
};

namespace {

// Runs `body`, turning every exception into a status code and a one-line fk_last_error().
template <typename F>
int Guard(F&& body) {
  try {
    body();
    forgekit::g_last_error.clear();
    return FK_OK;
  } catch (const Failure& e) {
    forgekit::g_last_error = e.what();
    return e.code;
  } catch (const tvm::ffi::Error& e) {
    // an index the model's bounds checks refused (forgekit/passes/index_checks.py): the input's fault, exit 9
    if (e.message().rfind(forgekit::kIndexErrorMarker, 0) == 0) {
      forgekit::g_last_error = forgekit::FirstLine(e.message());
      return FK_ERR_INPUT;
    }
    // a shape computed from input values that the data has not (the importer checks a Reshape to values with a
    // match_cast): the input's fault too (forgekit/runtime/engine.py SHAPE_CHECK)
    if (e.message().find(forgekit::kShapeCheck) != std::string::npos) {
      forgekit::g_last_error = "The input values ask for a shape the data does not have (" +
                               forgekit::FirstLine(e.message()) + "): check the values of the model's integer inputs.";
      return FK_ERR_INPUT;
    }
    forgekit::g_last_error = e.kind() + ": " + forgekit::FirstLine(e.message());
    return FK_ERR_RUNTIME;
  } catch (const std::exception& e) {
    forgekit::g_last_error = forgekit::FirstLine(e.what());
    return FK_ERR_RUNTIME;
  }
}

// The device asked for (FK_DEVICE_DEFAULT: the artifact's), refused when the artifact cannot run there.
DLDevice ChooseDevice(const forgekit::Metadata& meta, const std::string& what, int32_t kind, int32_t id) {
  bool cuda_artifact = meta.device_kind == "cuda";
  if (kind == FK_DEVICE_DEFAULT) kind = cuda_artifact ? FK_DEVICE_CUDA : FK_DEVICE_CPU;
  if (kind != FK_DEVICE_CPU && kind != FK_DEVICE_CUDA) {
    throw Failure(FK_ERR_USAGE, "Unknown device kind " + std::to_string(kind) + ": use FK_DEVICE_CPU or FK_DEVICE_CUDA.");
  }
  if (id < 0 || (kind == FK_DEVICE_CPU && id != 0)) {
    throw Failure(FK_ERR_USAGE, "Device id " + std::to_string(id) + " is not valid for the " +
                                    (kind == FK_DEVICE_CPU ? "CPU (only 0)." : "GPU (0 is the first)."));
  }
  // the code is compiled for one or the other: a CPU artifact has no GPU kernels and a CUDA one calls them
  if (cuda_artifact && kind == FK_DEVICE_CPU) {
    throw Failure(FK_ERR_INCOMPATIBLE, what + " was compiled for " + forgekit::DescribeGpu(meta) +
                                           ": it cannot run on the CPU (recompile it for a CPU target, e.g. -t x86-64).");
  }
  if (!cuda_artifact && kind == FK_DEVICE_CUDA) {
    throw Failure(FK_ERR_INCOMPATIBLE, what + " was compiled for the CPU: it cannot run on a GPU (recompile it with "
                                           "-t cuda/sm_XY for your GPU).");
  }
  return DLDevice{static_cast<DLDeviceType>(kind), id};
}

void Open(const std::string& path, const fk_open_options& options, fk_model* m) {
  const char* key_file = options.key_file;
  const char* password = options.password;
  using namespace forgekit;
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    throw Failure(FK_ERR_ARTIFACT, "Artifact '" + path + "' does not exist: compile one with 'forgekit compile'.");
  }
  bool is_dir = S_ISDIR(st.st_mode);
  size_t slash = path.rfind('/');
  std::string dir = is_dir ? path : slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  std::string library = is_dir ? JoinPath(path, "model_library.so") : path;
  if (!FileExists(library)) {
    throw Failure(FK_ERR_ARTIFACT, "'" + path + "' has no model_library.so: is it a forgekit artifact directory?");
  }
  std::string meta_path = JoinPath(dir, "metadata.json");
  if (!FileExists(meta_path)) {
    throw Failure(FK_ERR_ARTIFACT, "'" + path + "' has no metadata.json next to its library: the C runtime needs it.");
  }
  m->meta = ReadMetadata(meta_path);
  CheckRunnable(m->meta, "'" + path + "'");
  m->device = ChooseDevice(m->meta, "'" + path + "'", options.device_kind, options.device_id);
  if (m->device.device_type == kDLCUDA) {  // before the library: loading it needs the CUDA module loader
    LoadCudaRuntime(m->meta, "'" + path + "'", options.cuda_runtime);
    CheckCudaDevice(m->meta, "'" + path + "'", m->device.device_id);
  }
  std::tie(library, m->level) = ChooseLibrary(m->meta, dir, library);
  CheckSize(m->meta, library);
  PromoteTvmLibraries();
  // TVM's workers spin 300000 sched_yields (50-200 ms) after every inference unless told otherwise; read when
  // the pool first starts (forgekit/runtime/loader.py SPIN_COUNT: the same default for the Python runtime)
  setenv("TVM_THREAD_POOL_SPIN_COUNT", "10000", 0);
  if (IsEncrypted(library)) {
    std::string key = key_file ? key_file : JoinPath(dir, "modelKey.bin");
    const char* secret = password ? password : getenv("FORGEKIT_ENCRYPT_PASSWORD");
    if ((!key_file && !FileExists(key)) || !secret) {
      throw Failure(FK_ERR_ENCRYPTION, "Model looks encrypted but no key provided: pass the key file (modelKey.bin) "
                                       "and the password (FORGEKIT_ENCRYPT_PASSWORD).");
    }
    int fd = DecryptToMemfd(library, key, secret);
    try {
      m->library = LoadLibrary(FdPath(fd));
    } catch (const tvm::ffi::Error& e) {
      close(fd);
      throw Failure(FK_ERR_ARTIFACT, "Cannot load the decrypted model library (" + FirstLine(e.message()) +
                                         "): check that it was compiled for this machine and TVM version.");
    }
    close(fd);  // the code stays mapped until the module is freed
  } else {
    // what compile wrote, byte for byte (an encrypted library is authenticated chunk by chunk as it decrypts)
    CheckDigests(m->meta, library, !m->level.empty());
    std::string load_path = LoadPath(library);
    int fd = load_path.empty() ? CopyToMemfd(library) : -1;  // overwritten in place: its bytes from memory
    try {
      m->library = LoadLibrary(fd >= 0 ? FdPath(fd) : load_path);
    } catch (const tvm::ffi::Error& e) {
      if (fd >= 0) close(fd);
      throw Failure(FK_ERR_ARTIFACT, "Cannot load '" + library + "': " + FirstLine(e.message()));
    }
    if (fd >= 0) close(fd);
  }
  if (!m->level.empty()) {
    // a portable artifact's levels may share their weights in one file next to them: mapped and checked now,
    // so a missing or foreign file is a load error, not one at the first inference
    // (forgekit/backends/cpu/shared_weights.py; SHARED_WEIGHTS_CHECK in forgekit/artifact/layout.py)
    if (auto check = m->library->GetFunction("forgekit_shared_weights", true)) {
      try {
        (*check)();
      } catch (const tvm::ffi::Error& e) {
        throw Failure(FK_ERR_ARTIFACT, "Cannot load '" + library + "': " + FirstLine(e.message()));
      }
    }
  }
  auto make_vm = m->library->GetFunction("vm_load_executable", true);
  if (!make_vm) {
    throw Failure(FK_ERR_ARTIFACT, "'" + library + "' is not a Relax VM executable: recompile the artifact.");
  }
  m->vm = (*make_vm)().cast<tvm::ffi::Module>();
  // the device (DLPack's type and id), pooled allocator (2), then the host (CPU 0, pooled): as Engine does
  m->vm->GetFunction("vm_initialization", false).value()(static_cast<int>(m->device.device_type),
                                                         static_cast<int>(m->device.device_id), 2, 1, 0, 2);
  m->main = m->vm->GetFunction("main", false).value();
  m->inputs.resize(m->meta.inputs.size());
  m->borrowed.assign(m->meta.inputs.size(), false);
}

}  // namespace

extern "C" {

void fk_open_options_init(fk_open_options* options) {
  if (!options) return;
  std::memset(options, 0, sizeof *options);
  options->size = sizeof *options;
  options->device_kind = FK_DEVICE_DEFAULT;
}

int fk_open(const char* path, const char* key_file, const char* password, fk_model** model, char* errbuf,
            size_t errbuf_size) {
  fk_open_options options;
  fk_open_options_init(&options);
  options.key_file = key_file;
  options.password = password;
  return fk_open_ex(path, &options, model, errbuf, errbuf_size);
}

int fk_open_ex(const char* path, const fk_open_options* given, fk_model** model, char* errbuf, size_t errbuf_size) {
  if (model) *model = nullptr;
  fk_model* m = nullptr;
  int status = Guard([&] {
    if (!path || !model) throw Failure(FK_ERR_USAGE, "fk_open needs a path and a place for the model handle.");
    fk_open_options options;
    fk_open_options_init(&options);
    if (given) {
      if (given->size < offsetof(fk_open_options, device_kind) || given->size > sizeof options) {
        throw Failure(FK_ERR_USAGE, "fk_open_ex: options.size is " + std::to_string(given->size) + ", not that of "
                                    "this library's fk_open_options: call fk_open_options_init first.");
      }
      std::memcpy(&options, given, given->size);  // a caller built with an older header: the rest stays default
      options.size = sizeof options;
    }
    m = new fk_model();
    Open(path, options, m);
  });
  if (status != FK_OK) {
    delete m;
    if (errbuf && errbuf_size) snprintf(errbuf, errbuf_size, "%s", forgekit::g_last_error.c_str());
    return status;
  }
  *model = m;
  return FK_OK;
}

void fk_close(fk_model* model) {
  if (!model) return;
  // outputs and inputs before the VM, the VM before the library whose code it runs
  model->host_outputs.clear();
  model->outputs.clear();
  model->inputs.clear();
  delete model;
}

int fk_num_inputs(const fk_model* model) { return model ? static_cast<int>(model->meta.inputs.size()) : -1; }
int fk_num_outputs(const fk_model* model) { return model ? static_cast<int>(model->meta.outputs.size()) : -1; }

int fk_input_index(const fk_model* model, const char* name) {
  for (size_t i = 0; model && name && i < model->meta.inputs.size(); ++i) {
    if (model->meta.inputs[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

static int Describe(const fk_model* model, const std::vector<forgekit::TensorSpec>* specs, int index,
                    fk_tensor_info* info, const char* what) {
  return Guard([&] {
    if (!model || !info) {
      throw Failure(FK_ERR_USAGE, std::string("fk_") + what + "_info needs a model and an info struct.");
    }
    if (index < 0 || index >= static_cast<int>(specs->size())) {
      throw Failure(FK_ERR_USAGE, std::string(what) + " index " + std::to_string(index) +
                                      " is out of range: the model has " + std::to_string(specs->size()) + ".");
    }
    const forgekit::TensorSpec& t = (*specs)[index];
    // metadata.json has one layout for the model ("NCHW"): it describes the tensors of its rank only
    const char* layout = model->meta.layout.size() == t.shape.size() ? model->meta.layout.c_str() : "";
    *info = {t.name.c_str(), t.dtype.c_str(), layout, static_cast<int32_t>(t.shape.size()),
             t.shape.data(), t.symbol_ptrs.data(), t.dim_min.data(), t.dim_max.data(), t.dim_step.data()};
  });
}

int fk_input_info(const fk_model* model, int index, fk_tensor_info* info) {
  return Describe(model, model ? &model->meta.inputs : nullptr, index, info, "input");
}

int fk_output_info(const fk_model* model, int index, fk_tensor_info* info) {
  return Describe(model, model ? &model->meta.outputs : nullptr, index, info, "output");
}

}  // extern "C"

namespace {

// The checks of fk_set_input / fk_set_input_device against the metadata: the input's spec and the dtype's code.
std::pair<const forgekit::TensorSpec*, DLDataType> CheckInput(const fk_model* model, int index, const char* dtype,
                                                               const int64_t* shape, int32_t ndim,
                                                               const char* function) {
  if (!model || !dtype || ndim < 0 || (ndim > 0 && !shape)) {
    throw Failure(FK_ERR_USAGE, std::string(function) + " needs a model, a dtype and ndim dims.");
  }
  if (index < 0 || index >= static_cast<int>(model->meta.inputs.size())) {
    throw Failure(FK_ERR_USAGE, "Input index " + std::to_string(index) + " is out of range: the model takes " +
                                    std::to_string(model->meta.inputs.size()) + " input(s).");
  }
  const forgekit::TensorSpec& t = model->meta.inputs[index];
  std::vector<int64_t> got(shape, shape + ndim);
  const std::string name = "Input '" + t.name + "'";
  if (t.dtype != dtype) {
    throw Failure(FK_ERR_INPUT, name + " has dtype " + dtype + "; the model expects " + t.dtype + ".");
  }
  if (got.size() != t.shape.size()) {
    throw Failure(FK_ERR_INPUT, name + " has shape " + forgekit::Shape(got) + " (" + std::to_string(ndim) +
                                    " dimensions); the model expects " + forgekit::Shape(t.shape, &t.symbols) + " (" +
                                    std::to_string(t.shape.size()) + " dimensions).");
  }
  for (size_t axis = 0; axis < got.size(); ++axis) {
    std::string dim = " (dimension " + std::to_string(axis) + ")";
    if (t.shape[axis] >= 0 && got[axis] != t.shape[axis]) {
      throw Failure(FK_ERR_INPUT, name + " has shape " + forgekit::Shape(got) + "; the model expects " +
                                      forgekit::Shape(t.shape, &t.symbols) + " (dimension " + std::to_string(axis) +
                                      " must be " + std::to_string(t.shape[axis]) + ").");
    }
    if (t.shape[axis] >= 0) continue;
    const std::string& sym = t.symbols[axis];
    const std::string served =
        name + " has " + sym + "=" + std::to_string(got[axis]) + dim + "; this artifact serves " + sym;
    if (got[axis] < t.dim_min[axis] || (t.dim_max[axis] >= 0 && got[axis] > t.dim_max[axis])) {
      std::string high = t.dim_max[axis] >= 0 ? std::to_string(t.dim_max[axis]) : "any size";
      throw Failure(FK_ERR_INPUT, served + " from " + std::to_string(t.dim_min[axis]) + " to " + high + ".");
    }
    if (got[axis] % t.dim_step[axis]) {
      throw Failure(FK_ERR_INPUT, served + " in multiples of " + std::to_string(t.dim_step[axis]) + " only.");
    }
  }
  const forgekit::DtypeName* type = forgekit::FindDtype(dtype);
  if (!type) throw Failure(FK_ERR_USAGE, std::string("Unknown dtype '") + dtype + "'.");
  return {&t, type->type};
}

// Wraps memory the caller owns: the tensor frees nothing.
struct Borrowed {
  void* data;
  void AllocData(DLTensor* t) { t->data = data; }
  void FreeData(DLTensor*) {}
};

void CheckIndex(const fk_model* model, int index, const char* function) {
  if (!model) throw Failure(FK_ERR_USAGE, std::string(function) + " needs a model and an output struct.");
  if (model->outputs.empty()) throw Failure(FK_ERR_USAGE, "No outputs yet: call fk_run first.");
  if (index < 0 || index >= static_cast<int>(model->outputs.size())) {
    throw Failure(FK_ERR_USAGE, "Output index " + std::to_string(index) + " is out of range: the model returned " +
                                    std::to_string(model->outputs.size()) + " output(s).");
  }
}

fk_tensor OutputTensor(const fk_model* model, const tvm::ffi::Tensor& t, int index) {
  return {static_cast<const char*>(t.data_ptr()) + t.byte_offset(), forgekit::DtypeOf(t.dtype()), t.ndim(),
          model->output_shapes[index].data(), tvm::ffi::GetDataSize(t)};
}

}  // namespace

extern "C" {

int fk_set_input(fk_model* model, int index, const void* data, const char* dtype, const int64_t* shape,
                 int32_t ndim) {
  return Guard([&] {
    auto [spec, type] = CheckInput(model, index, dtype, shape, ndim, "fk_set_input");
    std::vector<int64_t> got(shape, shape + ndim);
    const std::string name = "Input '" + spec->name + "'";
    std::optional<tvm::ffi::Tensor>& slot = model->inputs[index];
    // A fresh buffer unless this input's own one fits and nothing else holds it: an output of the last run
    // may alias an input (an identity model), and it must stay as fk_get_output returned it; the caller's
    // memory of fk_set_input_device is never written to.
    if (!slot.has_value() || !slot.value().unique() || model->borrowed[index] ||
        std::vector<int64_t>(slot.value().shape().begin(), slot.value().shape().end()) != got) {
      if (model->device.device_type == kDLCPU) {
        slot = tvm::ffi::Tensor::FromNDAlloc(forgekit::AlignedAlloc(), tvm::ffi::ShapeView(got.data(), got.size()),
                                             type, DLDevice{kDLCPU, 0});
      } else {  // the device's own allocator (cudaMalloc for CUDA), through the TVM runtime
        static tvm::ffi::Function empty = tvm::ffi::Function::GetGlobalRequired("runtime.TVMTensorAllocWithScope");
        slot = empty(tvm::ffi::Shape(got), type, model->device, nullptr).cast<tvm::ffi::Tensor>();
      }
      model->borrowed[index] = false;
      if (!slot.value().data_ptr()) throw Failure(FK_ERR_RUNTIME, name + ": out of memory.");
    }
    size_t bytes = tvm::ffi::GetDataSize(slot.value());
    if (bytes && !data) throw Failure(FK_ERR_USAGE, name + ": data is NULL.");
    if (bytes && model->device.device_type == kDLCPU) std::memcpy(slot.value().data_ptr(), data, bytes);
    if (bytes && model->device.device_type != kDLCPU) forgekit::CopyFromHost(slot.value(), data, bytes);
  });
}

int fk_set_input_device(fk_model* model, int index, void* data, const char* dtype, const int64_t* shape,
                        int32_t ndim) {
  return Guard([&] {
    auto [spec, type] = CheckInput(model, index, dtype, shape, ndim, "fk_set_input_device");
    std::vector<int64_t> got(shape, shape + ndim);
    const std::string name = "Input '" + spec->name + "'";
    // TVM's kernels assume aligned buffers (64 bytes on the CPU; cudaMalloc gives 256): an unaligned one crashes
    if (!data || reinterpret_cast<uintptr_t>(data) % 64) {
      throw Failure(FK_ERR_USAGE, name + ": fk_set_input_device needs non-NULL, 64-byte aligned memory on the "
                                         "model's device.");
    }
    model->inputs[index] = tvm::ffi::Tensor::FromNDAlloc(Borrowed{data}, tvm::ffi::ShapeView(got.data(), got.size()),
                                                         type, model->device);
    model->borrowed[index] = true;
  });
}

int fk_run(fk_model* model) {
  return Guard([&] {
    if (!model) throw Failure(FK_ERR_USAGE, "fk_run needs a model.");
    std::map<std::string, std::pair<int64_t, std::string>> bound;  // symbol -> (value, input that set it)
    std::vector<tvm::ffi::AnyView> args;
    for (size_t i = 0; i < model->inputs.size(); ++i) {
      const forgekit::TensorSpec& t = model->meta.inputs[i];
      if (!model->inputs[i].has_value()) {
        throw Failure(FK_ERR_INPUT, "Input '" + t.name + "' was not set: call fk_set_input for every input before "
                                    "fk_run.");
      }
      tvm::ffi::ShapeView shape = model->inputs[i].value().shape();
      for (size_t axis = 0; axis < t.shape.size(); ++axis) {
        if (t.shape[axis] >= 0) continue;
        auto seen = bound.emplace(t.symbols[axis], std::make_pair(shape[axis], t.name)).first->second;
        if (seen.first != shape[axis]) {
          const std::string& sym = t.symbols[axis];
          throw Failure(FK_ERR_INPUT, "Input '" + t.name + "' has " + sym + "=" + std::to_string(shape[axis]) +
                                          " but input '" + seen.second + "' has " + sym + "=" +
                                          std::to_string(seen.first) + ": dimensions with the same name must agree.");
        }
      }
      args.emplace_back(model->inputs[i].value());
    }
    model->host_outputs.clear();
    model->outputs.clear();
    model->output_shapes.clear();
    tvm::ffi::Any result;
    model->main.CallPacked(args.data(), static_cast<int32_t>(args.size()), &result);
    forgekit::Flatten(result, &model->outputs);
    for (const tvm::ffi::Tensor& out : model->outputs) {
      DLDeviceType where = out.device().device_type;
      if ((where != kDLCPU && where != model->device.device_type) || !out.IsContiguous()) {
        throw Failure(FK_ERR_RUNTIME, "The model returned a non-contiguous tensor or one on another device: not "
                                      "supported here.");
      }
      model->output_shapes.emplace_back(out.shape().begin(), out.shape().end());
    }
    model->host_outputs.resize(model->outputs.size());
    if (model->device.device_type != kDLCPU) {
      // kernels are launched asynchronously: fk_run returns (and is timed) when they are done
      static tvm::ffi::Function sync = tvm::ffi::Function::GetGlobalRequired("runtime.Device_StreamSync");
      sync(model->device, static_cast<int64_t>(0));
    }
  });
}

int fk_get_output(fk_model* model, int index, fk_tensor* out) {
  return Guard([&] {
    if (!model || !out) throw Failure(FK_ERR_USAGE, "fk_get_output needs a model and an output struct.");
    CheckIndex(model, index, "fk_get_output");
    const tvm::ffi::Tensor& t = model->outputs[index];
    if (t.device().device_type == kDLCPU) {
      *out = OutputTensor(model, t, index);
      return;
    }
    std::optional<tvm::ffi::Tensor>& host = model->host_outputs[index];
    if (!host.has_value()) {  // copied once per run, only when asked for
      tvm::ffi::Tensor copy = tvm::ffi::Tensor::FromNDAlloc(forgekit::AlignedAlloc(), t.shape(), t.dtype(),
                                                            DLDevice{kDLCPU, 0});
      size_t bytes = tvm::ffi::GetDataSize(t);
      if (!copy.data_ptr()) throw Failure(FK_ERR_RUNTIME, "Output " + std::to_string(index) + ": out of memory.");
      if (bytes) forgekit::CopyToHost(t, copy.data_ptr(), bytes);
      host = copy;
    }
    *out = OutputTensor(model, host.value(), index);
  });
}

int fk_get_output_device(fk_model* model, int index, fk_tensor* out) {
  return Guard([&] {
    if (!model || !out) throw Failure(FK_ERR_USAGE, "fk_get_output_device needs a model and an output struct.");
    CheckIndex(model, index, "fk_get_output_device");
    *out = OutputTensor(model, model->outputs[index], index);
  });
}

int fk_parse_device(const char* text, int32_t* kind, int32_t* id) {
  return Guard([&] {
    if (!text || !kind || !id) throw Failure(FK_ERR_USAGE, "fk_parse_device needs a text, a kind and an id.");
    std::string spec = text;
    char* end = nullptr;
    if (spec.empty() || spec == "default") {
      *kind = FK_DEVICE_DEFAULT, *id = 0;
    } else if (spec == "cpu") {
      *kind = FK_DEVICE_CPU, *id = 0;
    } else if (spec == "cuda" || spec == "gpu") {
      *kind = FK_DEVICE_CUDA, *id = 0;
    } else if (spec.rfind("cuda:", 0) == 0 && spec.size() > 5 && isdigit(static_cast<unsigned char>(spec[5])) &&
               (*id = static_cast<int32_t>(strtol(spec.c_str() + 5, &end, 10)), *end == '\0')) {
      *kind = FK_DEVICE_CUDA;
    } else {
      throw Failure(FK_ERR_USAGE, "Unknown device '" + spec + "': use cpu, cuda or cuda:N (N = the GPU's index).");
    }
  });
}

int fk_model_device(const fk_model* model, int32_t* kind, int32_t* id) {
  return Guard([&] {
    if (!model || !kind || !id) throw Failure(FK_ERR_USAGE, "fk_model_device needs a model, a kind and an id.");
    *kind = static_cast<int32_t>(model->device.device_type);
    *id = model->device.device_id;
  });
}

const char* fk_last_error(void) { return forgekit::g_last_error.c_str(); }
const char* fk_level(const fk_model* model) { return model ? model->level.c_str() : ""; }

}  // extern "C"
