// forgekit-run: run a compiled forgekit artifact on .npy inputs and write its outputs as .npy files.
//
//   forgekit-run ARTIFACT -i in0.npy [-i in1.npy | -i NAME=file.npy] -o OUTDIR [--key modelKey.bin]
//                [--password-env VAR] [--device cpu|cuda|cuda:N]
//
// Inputs go by name (NAME=file) or in the model's input order (plain files fill the inputs left, in order).
// Each output is written to OUTDIR/<name>.npy (characters other than letters, digits, '.', '-' and '_'
// become '_').  Encrypted artifacts: the key file defaults to
// modelKey.bin next to the library, the password comes from $FORGEKIT_ENCRYPT_PASSWORD or the variable
// --password-env names (never from the command line, where `ps` shows it).  --device: where to run it, by
// default the device the artifact was compiled for (a CUDA artifact: GPU 0, which needs libtvm_runtime_cuda.so
// next to libtvm_runtime.so, libcudart.so.13 and the NVIDIA driver).  Errors: one line on stderr and forgekit's
// exit code (2 usage, 7 artifact, 9 input, 11 encryption, 12 not available: no GPU/driver/CUDA runtime for a
// CUDA artifact, 15 output write, 16 incompatible).
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "forgekit_runtime.hpp"

namespace {

const int kOutputWriteError = 15;

struct Npy {
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<char> data;
};

// numpy descr <-> dtype name, little-endian only ('|' for single bytes)
const char* const kDescr[][2] = {{"<f4", "float32"}, {"<f8", "float64"}, {"<f2", "float16"}, {"<i8", "int64"},
                                 {"<i4", "int32"},   {"<i2", "int16"},   {"|i1", "int8"},    {"|u1", "uint8"},
                                 {"<u2", "uint16"},  {"<u4", "uint32"},  {"<u8", "uint64"},  {"|b1", "bool"}};

std::string Field(const std::string& header, const std::string& key) {
  size_t at = header.find("'" + key + "'");
  if (at == std::string::npos) return "";
  at = header.find(':', at) + 1;
  while (at < header.size() && header[at] == ' ') ++at;
  size_t end = header[at] == '(' ? header.find(')', at) + 1 : header[at] == '\'' ? header.find('\'', at + 1) + 1
                                                                                 : header.find_first_of(",}", at);
  return header.substr(at, end - at);
}

Npy ReadNpy(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) throw forgekit::Error(FK_ERR_INPUT, "Input file '" + path + "' cannot be read: check the path.");
  char magic[8];
  if (!file.read(magic, 8) || std::memcmp(magic, "\x93NUMPY", 6) != 0) {
    throw forgekit::Error(FK_ERR_INPUT, "'" + path + "' is not a .npy file (save it with numpy.save).");
  }
  uint32_t length = 0;
  unsigned char len[4] = {0};
  file.read(reinterpret_cast<char*>(len), magic[6] == 1 ? 2 : 4);
  length = len[0] | (len[1] << 8) | (uint32_t(len[2]) << 16) | (uint32_t(len[3]) << 24);
  std::string header(length, '\0');
  file.read(&header[0], length);
  Npy npy;
  std::string descr = Field(header, "descr");
  for (const auto& d : kDescr) {
    if (descr == std::string("'") + d[0] + "'") {
      npy.dtype = d[1];
    }
  }
  if (npy.dtype.empty()) {
    throw forgekit::Error(FK_ERR_INPUT, "'" + path + "' holds dtype " + descr + ": forgekit-run reads little-endian "
                                        "float16/32/64, int8/16/32/64, uint8/16/32/64 and bool arrays.");
  }
  if (Field(header, "fortran_order") != "False") {
    throw forgekit::Error(FK_ERR_INPUT, "'" + path + "' is in Fortran order: save np.ascontiguousarray(x) instead.");
  }
  std::string shape = Field(header, "shape");
  size_t count = 1;
  for (size_t at = 1; at < shape.size();) {
    size_t end = shape.find_first_of(",)", at);
    std::string dim = shape.substr(at, end - at);
    if (dim.find_first_not_of(' ') != std::string::npos) {
      npy.shape.push_back(std::stoll(dim));
      count *= static_cast<size_t>(npy.shape.back());
    }
    at = end + 1;
  }
  size_t item = std::strcmp(npy.dtype.c_str(), "bool") == 0 ? 1 : std::stoul(descr.substr(3, descr.size() - 4));
  npy.data.resize(count * item);
  if (!file.read(npy.data.data(), static_cast<std::streamsize>(npy.data.size()))) {
    throw forgekit::Error(FK_ERR_INPUT, "'" + path + "' is truncated: its data is shorter than its shape says.");
  }
  return npy;
}

void WriteNpy(const std::string& path, const fk_tensor& t) {
  const char* descr = nullptr;
  for (const auto& d : kDescr) {
    if (std::strcmp(t.dtype, d[1]) == 0) descr = d[0];
  }
  if (!descr) {
    throw forgekit::Error(FK_ERR_RUNTIME, std::string("Output dtype ") + t.dtype + " has no .npy writer here.");
  }
  std::string shape;
  for (int32_t i = 0; i < t.ndim; ++i) {  // numpy's tuple spelling: (3,) and (2, 4)
    shape += std::to_string(t.shape[i]) + (t.ndim == 1 ? "," : i + 1 < t.ndim ? ", " : "");
  }
  std::string header = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': (" + shape + "), }";
  header.append(64 - (10 + header.size() + 1) % 64, ' ').push_back('\n');  // numpy pads to 64 bytes
  std::ofstream file(path, std::ios::binary);
  uint16_t length = static_cast<uint16_t>(header.size());
  file.write("\x93NUMPY\x01\x00", 8);
  file.put(static_cast<char>(length & 0xff)).put(static_cast<char>(length >> 8));
  file << header;
  file.write(static_cast<const char*>(t.data), static_cast<std::streamsize>(t.nbytes));
  if (!file.flush()) {
    throw forgekit::Error(kOutputWriteError, "Cannot write '" + path + "' (" + std::strerror(errno) +
                                                 "): check the output directory's permissions and free space.");
  }
}

std::string SafeName(const std::string& name) {
  std::string out = name;
  for (char& c : out) {
    if (!isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' && c != '_') c = '_';
  }
  return out.empty() || out[0] == '.' ? "_" + out : out;
}

const char kUsage[] =
    "usage: forgekit-run ARTIFACT -i INPUT.npy [-i NAME=INPUT.npy ...] -o OUTDIR [--key modelKey.bin] "
    "[--password-env VAR] [--device cpu|cuda|cuda:N]";

int Run(int argc, char** argv) {
  std::string artifact, outdir, key, password_env = "FORGEKIT_ENCRYPT_PASSWORD", device;
  std::vector<std::string> inputs;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    bool has_value = i + 1 < argc;
    if (arg == "-h" || arg == "--help") {
      std::cout << kUsage << "\n";
      return 0;
    } else if ((arg == "-i" || arg == "--input") && has_value) {
      inputs.push_back(argv[++i]);
    } else if ((arg == "-o" || arg == "--output") && has_value) {
      outdir = argv[++i];
    } else if (arg == "--key" && has_value) {
      key = argv[++i];
    } else if (arg == "--password-env" && has_value) {
      password_env = argv[++i];
    } else if (arg == "--device" && has_value) {
      device = argv[++i];
    } else if (arg[0] != '-' && artifact.empty()) {
      artifact = arg;
    } else {
      throw forgekit::Error(FK_ERR_USAGE, "unexpected argument '" + arg + "'. " + kUsage);
    }
  }
  if (artifact.empty() || outdir.empty()) throw forgekit::Error(FK_ERR_USAGE, kUsage);
  const char* password = getenv(password_env.c_str());
  forgekit::Device where = forgekit::Device::parse(device);  // checked before the artifact is opened
  forgekit::Model model(artifact, where, key.empty() ? nullptr : key.c_str(), password);
  if (static_cast<int>(inputs.size()) != model.num_inputs()) {
    std::string names;
    for (int i = 0; i < model.num_inputs(); ++i) names += (i ? ", " : "") + model.input_info(i).name;
    throw forgekit::Error(FK_ERR_INPUT, "The model takes " + std::to_string(model.num_inputs()) + " input(s) (" +
                                            names + "), got " + std::to_string(inputs.size()) + ".");
  }
  // NAME=file inputs first; plain files then fill the inputs left, in the model's order
  std::vector<std::string> files(inputs.size());
  for (const std::string& input : inputs) {
    size_t eq = input.find('=');
    if (eq == std::string::npos) continue;
    int index = model.input_index(input.substr(0, eq));
    if (!files[index].empty()) {
      throw forgekit::Error(FK_ERR_INPUT, "Input '" + input.substr(0, eq) + "' is given twice.");
    }
    files[index] = input.substr(eq + 1);
  }
  size_t next = 0;
  for (const std::string& input : inputs) {
    if (input.find('=') != std::string::npos) continue;
    while (!files[next].empty()) ++next;
    files[next] = input;
  }
  for (size_t i = 0; i < files.size(); ++i) {
    Npy npy = ReadNpy(files[i]);
    model.set_input(static_cast<int>(i), npy.data.data(), npy.dtype, npy.shape);
  }
  model.run();
  if (!model.level().empty()) std::cout << "level: " << model.level() << "\n";
  if (model.device().kind != FK_DEVICE_CPU) std::cout << "device: " << model.device().str() << "\n";
  if (mkdir(outdir.c_str(), 0755) != 0 && errno != EEXIST) {
    throw forgekit::Error(kOutputWriteError, "Cannot create '" + outdir + "' (" + std::strerror(errno) + ").");
  }
  for (int i = 0; i < model.num_outputs(); ++i) {
    fk_tensor out = model.output(i);
    std::string path = outdir + "/" + SafeName(model.output_info(i).name) + ".npy";
    WriteNpy(path, out);
    std::string shape;
    for (int32_t d = 0; d < out.ndim; ++d) shape += (d ? "x" : "") + std::to_string(out.shape[d]);
    std::cout << model.output_info(i).name << ": " << (shape.empty() ? "scalar" : shape) << " " << out.dtype << " -> "
              << path << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return Run(argc, argv);
  } catch (const forgekit::Error& e) {
    std::cerr << "forgekit-run: error: " << e.what() << "\n";
    return e.code();
  } catch (const std::exception& e) {  // a malformed .npy header (std::stoll), out of memory
    std::cerr << "forgekit-run: error: " << e.what() << "\n";
    return 1;
  }
}
