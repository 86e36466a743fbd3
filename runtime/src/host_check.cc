// Can this machine run the artifact?  Answered from metadata.json before any of the model's code runs
// (forgekit/runtime/compat.py): an AVX-512 library on an AVX2 CPU would otherwise die with SIGILL and no
// message, an aarch64 library fails to load with a bare "No such file".
#include <sys/stat.h>
#include <sys/utsname.h>

#include <cstdlib>
#include <set>
#include <string>

#include "../include/forgekit_runtime.h"
#include "internal.h"

namespace forgekit {
namespace {

std::string NormalizeArch(std::string machine) {
  for (char& c : machine) c = static_cast<char>(tolower(static_cast<unsigned char>(c)));
  if (machine == "amd64" || machine == "x86_64" || machine == "x64") return "x86_64";
  if (machine == "arm64" || machine == "aarch64") return "aarch64";
  if (machine.rfind("arm", 0) == 0) return "arm";
  return machine;
}

std::string HostArch() {
  struct utsname name;
  return uname(&name) == 0 ? NormalizeArch(name.machine) : "";
}

#if defined(__ANDROID__)
const char* kHostOs = "android";
#else
const char* kHostOs = "linux";
#endif

// The features (LLVM's names) this CPU executes, among those this compiler can ask about; `known` gets
// every name that was asked, so a feature nobody could ask about is not held against the artifact.
void HostFeatures(std::set<std::string>* have, std::set<std::string>* known) {
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
  __builtin_cpu_init();
#define FK_FEATURE(name)                                  \
  known->insert(name);                                    \
  if (__builtin_cpu_supports(name)) have->insert(name);
  FK_FEATURE("sse") FK_FEATURE("sse2") FK_FEATURE("sse3") FK_FEATURE("ssse3") FK_FEATURE("sse4.1")
  FK_FEATURE("sse4.2") FK_FEATURE("popcnt") FK_FEATURE("avx") FK_FEATURE("avx2") FK_FEATURE("fma")
  FK_FEATURE("f16c") FK_FEATURE("bmi") FK_FEATURE("bmi2") FK_FEATURE("lzcnt") FK_FEATURE("movbe")
  FK_FEATURE("fma4") FK_FEATURE("xop") FK_FEATURE("avx512f") FK_FEATURE("avx512bw") FK_FEATURE("avx512cd")
  FK_FEATURE("avx512dq") FK_FEATURE("avx512vl") FK_FEATURE("avx512vnni") FK_FEATURE("avx512bf16")
  FK_FEATURE("avx512ifma") FK_FEATURE("avx512vbmi") FK_FEATURE("avx512vbmi2") FK_FEATURE("avx512bitalg")
  FK_FEATURE("avx512vpopcntdq") FK_FEATURE("avx512fp16") FK_FEATURE("avxvnni")
#undef FK_FEATURE
#else
  (void)have;
  (void)known;  // other CPUs: not asked here (forgekit.runtime reads their hwcaps); the arch check remains
#endif
}

std::vector<std::string> Missing(const std::vector<std::string>& required) {
  std::set<std::string> have, known;
  HostFeatures(&have, &known);
  std::vector<std::string> missing;
  for (const std::string& f : required) {
    if (known.count(f) && !have.count(f)) missing.push_back(f);
  }
  return missing;
}

std::string Join(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

}  // namespace

void CheckRunnable(const Metadata& meta, const std::string& what) {
  std::string here = HostArch();
  std::string arch = meta.arch.empty() ? here : NormalizeArch(meta.arch);
  if (meta.device_os != kHostOs) {
    throw Failure(FK_ERR_INCOMPATIBLE, what + " is an " + meta.device_os + " library (" +
                                           (meta.target_name.empty() ? arch : meta.target_name) +
                                           "): run it on that device, not on this " + kHostOs + " machine.");
  }
  if (arch != here) {
    throw Failure(FK_ERR_INCOMPATIBLE, what + " is an " + arch + " library and this machine is " + here +
                                           ": run it on the board it was compiled for.");
  }
  if (meta.device_kind != "cpu" && meta.device_kind != "cuda") {
    throw Failure(FK_ERR_NOT_AVAILABLE, what + " is a " + meta.device_kind +
                                            " artifact: the forgekit C runtime runs CPU and CUDA artifacts only.");
  }
  std::vector<std::string> missing = Missing(meta.cpu_features);
  if (!missing.empty()) {
    throw Failure(FK_ERR_INCOMPATIBLE, what + " was built for " + arch + " with " + Join(missing) + " (" +
                                           (meta.cpu.empty() ? "its CPU" : meta.cpu) + "); this CPU lacks " +
                                           Join(missing) + ": recompile it for a target this CPU has.");
  }
}

std::string DescribeGpu(const Metadata& meta) {
  std::string out = "an NVIDIA GPU";
  if (!meta.gpu_arch.empty()) out += " " + meta.gpu_arch;
  if (!meta.gpu_generation.empty()) out += " (" + meta.gpu_generation + ")";
  if (!meta.cuda.empty()) {
    out += " with a CUDA " + meta.cuda + " driver";
    if (!meta.min_driver.empty()) out += " (R" + meta.min_driver + " or newer)";
  }
  return out;
}

std::pair<std::string, std::string> ChooseLibrary(const Metadata& meta, const std::string& dir,
                                                  const std::string& library) {
  // Levels are listed best first, the baseline (model_library.so, already checked) last.
  if (meta.variants.empty() || library != JoinPath(dir, meta.library_file)) return {library, ""};
  if (const char* forced = getenv("FORGEKIT_LEVEL"); forced && *forced) {  // as forgekit.runtime.compat
    for (const Variant& v : meta.variants) {
      if (v.name != forced) continue;
      if (!Missing(v.cpu_features).empty()) {
        throw Failure(FK_ERR_INCOMPATIBLE, std::string("FORGEKIT_LEVEL=") + forced +
                                               ": this CPU cannot run that level; unset it to let forgekit choose.");
      }
      return {JoinPath(dir, v.file), v.name};
    }
    std::vector<std::string> names;
    for (const Variant& v : meta.variants) names.push_back(v.name);
    throw Failure(FK_ERR_INCOMPATIBLE, std::string("FORGEKIT_LEVEL=") + forced + " is not a level of " + library +
                                           ": it has " + Join(names) + ".");
  }
  std::set<std::string> have, known;
  HostFeatures(&have, &known);
  if (known.empty()) return {JoinPath(dir, meta.variants.back().file), meta.variants.back().name};  // cannot ask
  for (const Variant& v : meta.variants) {
    if (Missing(v.cpu_features).empty()) return {JoinPath(dir, v.file), v.name};
  }
  const Variant& last = meta.variants.back();
  return {JoinPath(dir, last.file), last.name};
}

void CheckSize(const Metadata& meta, const std::string& library) {
  std::string name = library.substr(library.find_last_of('/') + 1);
  int64_t expected = name == meta.library_file ? meta.library_size : -1;
  for (const Variant& v : meta.variants) {
    if (v.file == name) expected = v.size;
  }
  struct stat st;
  if (expected < 0 || stat(library.c_str(), &st) != 0) return;
  if (static_cast<int64_t>(st.st_size) != expected) {
    throw Failure(FK_ERR_ARTIFACT, "'" + library + "' is " + std::to_string(st.st_size) +
                                       " bytes but its metadata.json records " + std::to_string(expected) +
                                       ": the file is damaged or was partly copied; copy the artifact again.");
  }
}

namespace {
// The sha256 recorded for the file named `name`, "" when metadata.json records none.
std::string RecordedDigest(const Metadata& meta, const std::string& name) {
  for (const Variant& v : meta.variants) {
    if (v.file == name && !v.sha256.empty()) return v.sha256;
  }
  if (name == meta.library_file) return meta.library_sha256;
  return name == meta.weights_file ? meta.weights_sha256 : "";
}

void CheckDigest(const std::string& path, const std::string& expected) {
  if (expected.empty()) return;
  std::string actual = Sha256File(path);  // "" without libcrypto: nothing to compare with
  if (!actual.empty() && actual != expected) {
    throw Failure(FK_ERR_ARTIFACT, "'" + path + "' does not match the sha256 in its metadata.json (" +
                                       actual.substr(0, 12) + "... instead of " + expected.substr(0, 12) +
                                       "...): the file is damaged or was changed after compile; copy the artifact "
                                       "again or recompile it.");
  }
}
}  // namespace

void CheckDigests(const Metadata& meta, const std::string& library, bool shared_weights) {
  size_t slash = library.find_last_of('/');
  std::string dir = slash == std::string::npos ? "." : library.substr(0, slash);
  CheckDigest(library, RecordedDigest(meta, library.substr(slash == std::string::npos ? 0 : slash + 1)));
  if (shared_weights && !meta.weights_file.empty() && FileExists(JoinPath(dir, meta.weights_file))) {
    CheckDigest(JoinPath(dir, meta.weights_file), meta.weights_sha256);
  }
}

}  // namespace forgekit
