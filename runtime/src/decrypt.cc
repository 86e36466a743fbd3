// Encrypted model libraries (docs/encryption-format.md), decrypted with OpenSSL's libcrypto straight into a
// sealed memfd, as forgekit.runtime.memload does: the plaintext never touches a file system, and the
// library is handed to the loader only after every chunk authenticated.  The checks run in the order the
// format document gives, so a damaged file is reported as damaged and not as a wrong password.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <tvm/ffi/any.h>
#include <tvm/ffi/container/map.h>
#include <tvm/ffi/extra/json.h>
#include <tvm/ffi/string.h>
#include <vector>

#include "../include/forgekit_runtime.h"
#include "internal.h"

#ifndef FORGEKIT_NO_CRYPTO
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/sha.h>
#endif

namespace forgekit {

namespace {
const unsigned char kLibMagic[8] = {0x89, 'F', 'K', 'L', 'I', 'B', '\r', '\n'};
const unsigned char kKeyMagic[8] = {0x89, 'F', 'K', 'K', 'E', 'Y', '\r', '\n'};
}  // namespace

bool IsEncrypted(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  unsigned char head[8] = {0};
  return file.read(reinterpret_cast<char*>(head), 8) && std::memcmp(head, kLibMagic, 8) == 0;
}

#ifdef FORGEKIT_NO_CRYPTO
std::string Sha256File(const std::string&) { return ""; }

int DecryptToMemfd(const std::string& library, const std::string&, const std::string&) {
  throw Failure(FK_ERR_NOT_AVAILABLE, "'" + library + "' is encrypted and this forgekit runtime was built without "
                                          "OpenSSL: rebuild it with libcrypto (libssl-dev).");
}
#else

namespace {

namespace json = tvm::ffi::json;
using Bytes = std::vector<unsigned char>;

Failure Corrupt(const std::string& what, const std::string& path, const std::string& detail) {
  return Failure(FK_ERR_ENCRYPTION, what + " '" + path + "' is corrupt (" + detail +
                                        "): re-copy it from the original or re-encrypt the model.");
}

}  // namespace

std::string Sha256File(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) throw Failure(FK_ERR_ARTIFACT, "Cannot read '" + path + "': check its permissions.");
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1) {
    throw Failure(FK_ERR_RUNTIME, "libcrypto cannot compute SHA-256.");
  }
  std::vector<char> block(1 << 20);
  while (file.read(block.data(), static_cast<std::streamsize>(block.size())) || file.gcount() > 0) {
    EVP_DigestUpdate(ctx.get(), block.data(), static_cast<size_t>(file.gcount()));
  }
  unsigned char digest[32];
  unsigned int length = 0;
  EVP_DigestFinal_ex(ctx.get(), digest, &length);
  static const char kHex[] = "0123456789abcdef";
  std::string hex;
  for (unsigned int i = 0; i < length; ++i) hex += {kHex[digest[i] >> 4], kHex[digest[i] & 15]};
  return hex;
}

namespace {

uint32_t Be32(const unsigned char* p) { return (uint32_t(p[0]) << 24) | (p[1] << 16) | (p[2] << 8) | p[3]; }

Bytes Sha256(const unsigned char* data, size_t n) {
  Bytes out(SHA256_DIGEST_LENGTH);
  SHA256(data, n, out.data());
  return out;
}

// The JSON body as a map; every field is checked for its type (the files are untrusted input).
struct Body {
  tvm::ffi::Any root;
  std::string what, path;
  std::optional<tvm::ffi::Any> Get(const char* key) const {
    auto map = root.try_cast<json::Object>();
    if (!map) return std::nullopt;
    auto it = map->find(tvm::ffi::Any(tvm::ffi::String(key)));
    if (it == map->end()) return std::nullopt;
    return (*it).second;
  }
  std::string Str(const char* key) const {
    auto v = Get(key);
    auto s = v ? v->try_cast<tvm::ffi::String>() : std::nullopt;
    if (!s) throw Corrupt(what, path, std::string("field '") + key + "' is not a string");
    return std::string(*s);
  }
  int64_t Int(const char* key, int64_t lo, int64_t hi) const {
    auto v = Get(key);
    if (!v || v->type_index() != tvm::ffi::TypeIndex::kTVMFFIInt || v->cast<int64_t>() < lo ||
        v->cast<int64_t>() > hi) {
      throw Corrupt(what, path, std::string("field '") + key + "' is not an integer in [" + std::to_string(lo) +
                                    ", " + std::to_string(hi) + "]");
    }
    return v->cast<int64_t>();
  }
  Bytes Hex(const char* key, size_t size) const {
    std::string s = Str(key);
    Bytes out;
    for (size_t i = 0; s.size() == 2 * size && i < size; ++i) {
      char* end = nullptr;
      std::string pair = s.substr(2 * i, 2);
      long byte = strtol(pair.c_str(), &end, 16);
      if (*end != '\0' || !isxdigit(static_cast<unsigned char>(pair[0]))) break;
      out.push_back(static_cast<unsigned char>(byte));
    }
    if (out.size() != size) throw Corrupt(what, path, std::string("field '") + key + "' is not hex bytes");
    return out;
  }
};

// Magic, version and body length of a library header or key file; *end: the end of its JSON body.
void ReadPrefix(const Bytes& data, const unsigned char* magic, const std::string& what, const std::string& path,
                uint32_t max_json, size_t* end) {
  if (data.size() < 8 || std::memcmp(data.data(), magic, 8) != 0) {
    throw Failure(FK_ERR_ENCRYPTION, "'" + path + "' is not " + (magic == kKeyMagic ? "a forgekit key file" :
                                     "an encrypted forgekit library") + " (wrong magic bytes): check the path.");
  }
  if (data.size() < 14) throw Corrupt(what, path, "truncated header");
  unsigned version = (data[8] << 8) | data[9];
  if (version != 1) {
    throw Failure(FK_ERR_ENCRYPTION, "'" + path + "' uses format version " + std::to_string(version) +
                                         ", this runtime reads only version 1: use a runtime that supports it.");
  }
  uint32_t length = Be32(&data[10]);
  if (length < 2 || length > max_json) throw Corrupt(what, path, "header length out of range");
  if (data.size() < 14 + size_t(length)) throw Corrupt(what, path, "truncated header");
  *end = 14 + length;
}

// The JSON body (parsed only after its checksum matched: damage is reported as damage, not as bad JSON).
Body ParseBody(const Bytes& data, size_t end, const std::string& what, const std::string& path) {
  tvm::ffi::String error;
  std::string text(reinterpret_cast<const char*>(&data[14]), end - 14);
  Body body{json::Parse(tvm::ffi::String(text), &error), what, path};
  if (!error.empty() || !body.root.try_cast<json::Object>()) throw Corrupt(what, path, "header is not a JSON object");
  return body;
}

Bytes ReadFile(const std::string& path, size_t limit, int missing_code, const std::string& missing) {
  std::ifstream file(path, std::ios::binary);
  if (!file) throw Failure(missing_code, missing);
  Bytes data;
  char buf[4096];
  while (data.size() <= limit && file.read(buf, sizeof buf).gcount() > 0) {
    data.insert(data.end(), buf, buf + file.gcount());
  }
  return data;
}

// AES-256-GCM decryption of `n` bytes with the 16-byte tag after them; false when authentication fails.
bool GcmOpen(const unsigned char* key, const unsigned char* nonce, const unsigned char* aad, size_t aad_n,
             const unsigned char* in, size_t n, unsigned char* out) {
  EVP_CIPHER_CTX* ctx = EVP_CIPHER_CTX_new();
  int len = 0;
  bool ok = ctx && EVP_DecryptInit_ex(ctx, EVP_aes_256_gcm(), nullptr, nullptr, nullptr) == 1 &&
            EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_IVLEN, 12, nullptr) == 1 &&
            EVP_DecryptInit_ex(ctx, nullptr, nullptr, key, nonce) == 1 &&
            EVP_DecryptUpdate(ctx, nullptr, &len, aad, static_cast<int>(aad_n)) == 1 &&
            (n == 0 || EVP_DecryptUpdate(ctx, out, &len, in, static_cast<int>(n)) == 1) &&
            EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_TAG, 16, const_cast<unsigned char*>(in + n)) == 1 &&
            EVP_DecryptFinal_ex(ctx, out + n, &len) == 1;
  EVP_CIPHER_CTX_free(ctx);
  return ok;
}

struct Header {
  std::string uuid, fingerprint;
  Bytes key_id, nonce_prefix, digest;
  int64_t chunk_size = 0, plaintext_size = 0, size = 0;
  int64_t Chunks() const { return plaintext_size == 0 ? 1 : (plaintext_size + chunk_size - 1) / chunk_size; }
};

Header ReadHeader(const std::string& path, int fd) {
  const std::string what = "Encrypted library";
  Bytes data(14 + 65536 + 32);
  ssize_t got = pread(fd, data.data(), data.size(), 0);
  data.resize(got > 0 ? size_t(got) : 0);
  size_t end = 0;
  ReadPrefix(data, kLibMagic, what, path, 65536, &end);
  if (data.size() < end + 32) throw Corrupt(what, path, "truncated header");
  Header h;
  h.digest = Sha256(data.data(), end);
  if (std::memcmp(h.digest.data(), &data[end], 32) != 0) throw Corrupt(what, path, "header checksum mismatch");
  Body body = ParseBody(data, end, what, path);
  if (body.Str("cipher") != "AES-256-GCM") throw Corrupt(what, path, "unknown cipher");
  h.uuid = body.Str("uuid");
  h.fingerprint = body.Str("fingerprint");
  h.key_id = body.Hex("key_id", 16);
  h.nonce_prefix = body.Hex("nonce_prefix", 8);
  h.chunk_size = body.Int("chunk_size", 256, int64_t(64) << 20);
  h.plaintext_size = body.Int("plaintext_size", 0, int64_t(1) << 60);
  h.size = static_cast<int64_t>(end) + 32;
  struct stat st;
  int64_t expected = h.size + h.plaintext_size + 16 * h.Chunks();
  if (fstat(fd, &st) != 0 || st.st_size != expected) {
    throw Corrupt(what, path, std::string(st.st_size < expected ? "truncated" : "extended") + ": " +
                                  std::to_string(st.st_size) + " bytes, expected " + std::to_string(expected));
  }
  return h;
}

// The data key, after the key file's checks, the identity match, scrypt and the unwrap.
Bytes UnwrapKey(const Header& h, const std::string& lib, const std::string& key_path, const std::string& password) {
  const std::string what = "Key file";
  Bytes data = ReadFile(key_path, 14 + 16384 + 12 + 48 + 32, FK_ERR_ENCRYPTION,
                        "Key file '" + key_path + "' does not exist: pass the modelKey.bin written when the model "
                        "was encrypted.");
  size_t end = 0;
  ReadPrefix(data, kKeyMagic, what, key_path, 16384, &end);
  if (data.size() != end + 12 + 48 + 32) {
    throw Corrupt(what, key_path, data.size() < end + 92 ? "truncated" : "trailing bytes");
  }
  if (Sha256(data.data(), data.size() - 32) != Bytes(data.end() - 32, data.end())) {
    throw Corrupt(what, key_path, "checksum mismatch");
  }
  Body body = ParseBody(data, end, what, key_path);
  if (body.Str("kdf") != "scrypt" || body.Str("wrap") != "AES-256-GCM") {
    throw Corrupt(what, key_path, "unknown algorithms");
  }
  int64_t n = body.Int("kdf_n", 2, 1 << 20), r = body.Int("kdf_r", 1, 32), p = body.Int("kdf_p", 1, 16);
  if ((n & (n - 1)) != 0 || 128 * n * r > (int64_t(1) << 30)) throw Corrupt(what, key_path, "scrypt cost out of range");
  Bytes salt = body.Hex("salt", 16), key_id = body.Hex("key_id", 16);
  if (body.Str("uuid") != h.uuid || body.Str("fingerprint") != h.fingerprint) {
    throw Failure(FK_ERR_ENCRYPTION, "Key file '" + key_path + "' belongs to another model than '" + lib +
                                         "': pass that model's key file.");
  }
  if (key_id != h.key_id) {
    throw Failure(FK_ERR_ENCRYPTION, "Key file '" + key_path + "' is from another encryption of this model: pass the "
                                         "key file written together with '" + lib + "'.");
  }
  if (password.empty()) throw Failure(FK_ERR_ENCRYPTION, "The password is empty: give the model's password.");
  unsigned char kek[32], data_key[32];
  uint64_t maxmem = 128 * uint64_t(n) * r * (p + 1) + (uint64_t(64) << 20);  // OpenSSL's default cap is 32 MiB
  if (EVP_PBE_scrypt(password.data(), password.size(), salt.data(), salt.size(), n, r, p, maxmem, kek, 32) != 1) {
    throw Failure(FK_ERR_ENCRYPTION, "scrypt failed for key file '" + key_path + "' (out of memory?).");
  }
  bool ok = GcmOpen(kek, &data[end], data.data(), end, &data[end + 12], 32, data_key);
  OPENSSL_cleanse(kek, sizeof kek);
  if (!ok) {
    throw Failure(FK_ERR_ENCRYPTION, "Wrong password for key file '" + key_path +
                                         "': check the password (or its file/environment variable).");
  }
  static const char kLabel[] = "forgekit/v1/key-id";
  unsigned char mac[32];
  unsigned int mac_n = 0;
  HMAC(EVP_sha256(), data_key, 32, reinterpret_cast<const unsigned char*>(kLabel), sizeof kLabel - 1, mac, &mac_n);
  Bytes out(data_key, data_key + 32);
  OPENSSL_cleanse(data_key, sizeof data_key);
  if (std::memcmp(mac, key_id.data(), 16) != 0) {
    OPENSSL_cleanse(out.data(), out.size());
    throw Corrupt(what, key_path, "key id does not match its key");
  }
  return out;
}

void WriteAll(int fd, const unsigned char* data, size_t n) {
  while (n > 0) {
    ssize_t written = write(fd, data, n);
    if (written <= 0) throw Failure(FK_ERR_ARTIFACT, "Cannot write the decrypted library to memory (out of memory?).");
    data += written;
    n -= size_t(written);
  }
}

}  // namespace

int DecryptToMemfd(const std::string& library, const std::string& key_file, const std::string& password) {
  int lib_fd = open(library.c_str(), O_RDONLY | O_CLOEXEC);
  if (lib_fd < 0) throw Failure(FK_ERR_ARTIFACT, "Encrypted library '" + library + "' cannot be read: check the path.");
  int mem_fd = -1;
  Bytes data_key;
  try {
    Header h = ReadHeader(library, lib_fd);
    data_key = UnwrapKey(h, library, key_file, password);
    mem_fd = memfd_create("forgekit-model", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (mem_fd < 0) {
      throw Failure(FK_ERR_NOT_AVAILABLE, "memfd_create failed: loading from memory needs Linux >= 3.17.");
    }
    int64_t n = h.Chunks();
    Bytes blob(static_cast<size_t>(std::min(h.chunk_size, h.plaintext_size)) + 16), plain(blob.size());
    off_t offset = static_cast<off_t>(h.size);
    for (int64_t i = 0; i < n; ++i) {
      size_t length = static_cast<size_t>(std::min(h.chunk_size, h.plaintext_size - i * h.chunk_size));
      if (pread(lib_fd, blob.data(), length + 16, offset) != ssize_t(length + 16)) {
        throw Corrupt("Encrypted library", library, "truncated while reading chunk " + std::to_string(i));
      }
      offset += static_cast<off_t>(length + 16);
      unsigned char nonce[12], aad[41];
      std::memcpy(nonce, h.nonce_prefix.data(), 8);
      for (int b = 0; b < 4; ++b) nonce[8 + b] = static_cast<unsigned char>(uint64_t(i) >> (8 * (3 - b)));
      std::memcpy(aad, h.digest.data(), 32);
      for (int b = 0; b < 8; ++b) aad[32 + b] = static_cast<unsigned char>(uint64_t(i) >> (8 * (7 - b)));
      aad[40] = i == n - 1 ? 1 : 0;
      if (!GcmOpen(data_key.data(), nonce, aad, sizeof aad, blob.data(), length, plain.data())) {
        throw Failure(FK_ERR_ENCRYPTION, "Encrypted library '" + library + "' is corrupt or was tampered with (chunk " +
                                             std::to_string(i) + " of " + std::to_string(n) +
                                             " fails authentication): re-copy it from the original.");
      }
      WriteAll(mem_fd, plain.data(), length);
    }
    OPENSSL_cleanse(plain.data(), plain.size());
    OPENSSL_cleanse(data_key.data(), data_key.size());
    // nobody (not even this process) can change the code from here on; a kernel without seals still loads
    fcntl(mem_fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL);
  } catch (...) {
    if (!data_key.empty()) OPENSSL_cleanse(data_key.data(), data_key.size());
    if (mem_fd >= 0) close(mem_fd);
    close(lib_fd);
    throw;
  }
  close(lib_fd);
  return mem_fd;
}
#endif  // FORGEKIT_NO_CRYPTO

}  // namespace forgekit
