// Encryption at rest for offloaded blocks (libsodium).
//
// Key hierarchy:
//   key-encryption key (KEK, 32 bytes)  from a KeyProvider: environment, file, passphrase
//        |                              (Argon2id), or the caller's own bytes
//        | wraps (XChaCha20-Poly1305, AD = "kvpack-wrap-v1" || cache id)
//        v
//   data key (32 bytes)                 random per cache, never leaves guarded memory in clear
//        | crypto_kdf (BLAKE2b), context "kvpackbk"
//        +-- subkey 1: AEAD key (XChaCha20-Poly1305 IETF or AES-256-GCM)
//        +-- subkey 2: MAC key (keyed BLAKE2b-128, for Aead::none records)
//
// All secrets live in SecretBytes (guarded, mlock()ed where allowed, wiped on free).
// AEAD choice: AES-256-GCM where crypto_aead_aes256gcm_is_available() (AES-NI + PCLMUL), else
// XChaCha20-Poly1305; XChaCha uses a random 192-bit nonce per record, AES-GCM a 96-bit
// per-key counter (never random: the 96-bit space is too small for random nonces).
#pragma once

#include <sodium.h>
#include <sys/stat.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include <fcntl.h>
#include <unistd.h>

#include "kvpack/offload/block_header.hpp"
#include "kvpack/offload/block_id.hpp"
#include "kvpack/offload/secure_memory.hpp"
#include "kvpack/result.hpp"

namespace kvpack::offload {

/// Bytes of every key in this file (KEK, data key, subkeys).
inline constexpr std::size_t kKeyBytes = 32;
/// Bytes of the nonce field of a record (XChaCha uses all 24; AES-GCM the first 12, rest 0).
inline constexpr std::size_t kNonceFieldBytes = 24;
/// Bytes of the authentication tag of a record (all three protections).
inline constexpr std::size_t kTagBytes = 16;

/// True when this CPU runs libsodium's AES-256-GCM (AES-NI and PCLMULQDQ).
[[nodiscard]] inline bool aes256gcm_available() {
  if (!ensure_sodium()) return false;
  return crypto_aead_aes256gcm_is_available() != 0;
}

/// The AEAD used when the caller asks for the best one: AES-256-GCM where the CPU has it,
/// else XChaCha20-Poly1305.
[[nodiscard]] inline Aead best_available_aead() {
  return aes256gcm_available() ? Aead::aes256gcm : Aead::xchacha20poly1305;
}

// ---------------------------------------------------------------------------------------------
// Key providers
// ---------------------------------------------------------------------------------------------

/// Source of the key-encryption key (KEK) that wraps each cache's random data key.
/// Implementations must return a fresh 32-byte SecretBytes on every call.
class KeyProvider {
 public:
  virtual ~KeyProvider() = default;
  /// The 32-byte KEK. Errors: Errc::invalid_argument (missing or malformed key material),
  /// Errc::io_error (cannot read it), Errc::capacity_exceeded (out of memory).
  [[nodiscard]] virtual Result<SecretBytes> key_encryption_key() const = 0;
  /// Short description for messages ("environment variable KVPACK_OFFLOAD_KEY").
  [[nodiscard]] virtual std::string describe() const = 0;
};

namespace detail {
/// Decodes exactly 64 hex digits (optionally followed by whitespace) into a guarded 32-byte
/// key, without making an unguarded copy of the input.
[[nodiscard]] inline Result<SecretBytes> key_from_hex(const char* hex, std::size_t len, const std::string& what) {
  while (len > 0 && (hex[len - 1] == '\n' || hex[len - 1] == '\r' || hex[len - 1] == ' ' || hex[len - 1] == '\t')) --len;
  if (len != 2 * kKeyBytes)
    return fail(Errc::invalid_argument, what + ": expected " + std::to_string(2 * kKeyBytes) +
                                            " hex digits, got " + std::to_string(len) + " characters");
  auto key = SecretBytes::allocate(kKeyBytes);
  if (!key) return key.error();
  std::size_t bin_len = 0;
  const char* end = nullptr;
  auto* out = reinterpret_cast<unsigned char*>(key->writable().data());
  if (sodium_hex2bin(out, kKeyBytes, hex, len, nullptr, &bin_len, &end) != 0 || bin_len != kKeyBytes ||
      end != hex + len)
    return fail(Errc::invalid_argument, what + ": not a valid hex key");
  key->seal();
  return std::move(key).value();
}
}  // namespace detail

/// KEK as 64 hex digits in an environment variable (default KVPACK_OFFLOAD_KEY). Meant for
/// tests and containers whose secret store injects environment variables.
class EnvKeyProvider final : public KeyProvider {
 public:
  explicit EnvKeyProvider(std::string variable = "KVPACK_OFFLOAD_KEY") : var_(std::move(variable)) {}
  [[nodiscard]] Result<SecretBytes> key_encryption_key() const override {
    const char* v = std::getenv(var_.c_str());
    if (!v) return fail(Errc::invalid_argument, describe() + " is not set");
    return detail::key_from_hex(v, std::strlen(v), describe());
  }
  [[nodiscard]] std::string describe() const override { return "environment variable " + var_; }

 private:
  std::string var_;
};

/// KEK from a file holding either exactly 32 raw bytes or 64 hex digits (plus an optional
/// trailing newline). The file must not be readable or writable by group or others
/// (mode & 077 == 0), else Errc::invalid_argument, as ssh does for private keys.
class FileKeyProvider final : public KeyProvider {
 public:
  explicit FileKeyProvider(std::string path) : path_(std::move(path)) {}
  [[nodiscard]] Result<SecretBytes> key_encryption_key() const override {
    const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return fail(Errc::io_error, describe() + ": " + std::strerror(errno));
    struct Closer {
      int fd;
      ~Closer() { ::close(fd); }
    } closer{fd};
    struct stat st {};
    if (::fstat(fd, &st) != 0) return fail(Errc::io_error, describe() + ": " + std::strerror(errno));
    if ((st.st_mode & 077) != 0)
      return fail(Errc::invalid_argument, describe() + " is accessible by group or others (chmod 600 it)");
    constexpr std::size_t cap = 2 * kKeyBytes + 3;  // hex + "\r\n" + one byte to detect overlong
    auto buf = SecretBytes::allocate(cap);
    if (!buf) return buf.error();
    std::size_t got = 0;
    while (got < cap) {
      const ssize_t n = ::read(fd, buf->writable().data() + got, cap - got);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return fail(Errc::io_error, describe() + ": " + std::strerror(errno));
      if (n == 0) break;
      got += static_cast<std::size_t>(n);
    }
    if (got == kKeyBytes) return SecretBytes::copy_of(buf->bytes().first(kKeyBytes));
    return detail::key_from_hex(reinterpret_cast<const char*>(buf->bytes().data()), got, describe());
  }
  [[nodiscard]] std::string describe() const override { return "key file " + path_; }

 private:
  std::string path_;
};

/// KEK derived from a passphrase with Argon2id (crypto_pwhash, ALG_ARGON2ID13, RFC 9106).
/// The salt (16 bytes) must be stored by the caller to derive the same key again; ops and
/// memory limits default to libsodium's INTERACTIVE level (2 passes, 64 MiB).
class PassphraseKeyProvider final : public KeyProvider {
 public:
  static constexpr std::size_t kSaltBytes = crypto_pwhash_SALTBYTES;
  using Salt = std::array<std::byte, kSaltBytes>;

  /// A random salt (store it next to whatever needs the key again).
  [[nodiscard]] static Salt random_salt() {
    Salt s{};
    if (ensure_sodium()) randombytes_buf(s.data(), s.size());
    return s;
  }
  /// Copies `passphrase` into guarded memory. Errc::invalid_argument for an empty passphrase
  /// or limits below libsodium's minimum.
  [[nodiscard]] static Result<PassphraseKeyProvider> create(
      std::string_view passphrase, const Salt& salt,
      unsigned long long opslimit = crypto_pwhash_OPSLIMIT_INTERACTIVE,
      std::size_t memlimit = crypto_pwhash_MEMLIMIT_INTERACTIVE) {
    if (passphrase.empty()) return fail(Errc::invalid_argument, "passphrase is empty");
    if (opslimit < crypto_pwhash_OPSLIMIT_MIN || memlimit < crypto_pwhash_MEMLIMIT_MIN)
      return fail(Errc::invalid_argument, "Argon2id limits below libsodium's minimum");
    auto pw = SecretBytes::copy_of(std::as_bytes(std::span(passphrase.data(), passphrase.size())));
    if (!pw) return pw.error();
    return PassphraseKeyProvider(std::move(pw).value(), salt, opslimit, memlimit);
  }
  [[nodiscard]] Result<SecretBytes> key_encryption_key() const override {
    auto key = SecretBytes::allocate(kKeyBytes);
    if (!key) return key.error();
    if (crypto_pwhash(reinterpret_cast<unsigned char*>(key->writable().data()), kKeyBytes,
                      reinterpret_cast<const char*>(pw_.bytes().data()), pw_.size(),
                      reinterpret_cast<const unsigned char*>(salt_.data()), opslimit_, memlimit_,
                      crypto_pwhash_ALG_ARGON2ID13) != 0)
      return fail(Errc::capacity_exceeded, describe() + ": Argon2id ran out of memory");
    key->seal();
    return std::move(key).value();
  }
  [[nodiscard]] std::string describe() const override { return "passphrase (Argon2id)"; }

 private:
  PassphraseKeyProvider(SecretBytes pw, const Salt& salt, unsigned long long ops, std::size_t mem)
      : pw_(std::move(pw)), salt_(salt), opslimit_(ops), memlimit_(mem) {}
  SecretBytes pw_;
  Salt salt_;
  unsigned long long opslimit_;
  std::size_t memlimit_;
};

/// The caller's own 32-byte KEK (from an HSM, a KMS, a secret manager...), copied into
/// guarded memory at construction; the caller may wipe its copy afterwards.
class StaticKeyProvider final : public KeyProvider {
 public:
  /// Errc::invalid_argument unless `key` is exactly 32 bytes.
  [[nodiscard]] static Result<StaticKeyProvider> create(std::span<const std::byte> key) {
    if (key.size() != kKeyBytes)
      return fail(Errc::invalid_argument, "caller key must be 32 bytes, got " + std::to_string(key.size()));
    auto k = SecretBytes::copy_of(key);
    if (!k) return k.error();
    return StaticKeyProvider(std::move(k).value());
  }
  [[nodiscard]] Result<SecretBytes> key_encryption_key() const override { return SecretBytes::copy_of(key_.bytes()); }
  [[nodiscard]] std::string describe() const override { return "caller-supplied key"; }

 private:
  explicit StaticKeyProvider(SecretBytes k) : key_(std::move(k)) {}
  SecretBytes key_;
};

// ---------------------------------------------------------------------------------------------
// Data key wrapping
// ---------------------------------------------------------------------------------------------

/// A data key encrypted under a KEK: nonce (24) || ciphertext (32) || tag (16). Safe to store
/// next to the data (a kept offload file's superblock holds it).
using WrappedKey = std::array<std::byte, kNonceFieldBytes + kKeyBytes + kTagBytes>;

namespace detail {
inline std::array<unsigned char, 14 + 16> wrap_ad(const CacheId& id) {
  std::array<unsigned char, 14 + 16> ad{};
  std::memcpy(ad.data(), "kvpack-wrap-v1", 14);
  std::memcpy(ad.data() + 14, id.bytes.data(), 16);
  return ad;
}
}  // namespace detail

/// Encrypts `data_key` under `kek` (XChaCha20-Poly1305, random nonce), bound to `cache`.
[[nodiscard]] inline Result<WrappedKey> wrap_data_key(const SecretBytes& kek, const SecretBytes& data_key,
                                                     const CacheId& cache) {
  if (auto s = ensure_sodium(); !s) return s.error();
  if (kek.size() != kKeyBytes || data_key.size() != kKeyBytes)
    return fail(Errc::invalid_argument, "wrap_data_key: keys must be 32 bytes");
  WrappedKey w{};
  auto* out = reinterpret_cast<unsigned char*>(w.data());
  randombytes_buf(out, kNonceFieldBytes);
  const auto ad = detail::wrap_ad(cache);
  crypto_aead_xchacha20poly1305_ietf_encrypt_detached(out + kNonceFieldBytes, out + kNonceFieldBytes + kKeyBytes,
                                                      nullptr, data_key.uchar(), kKeyBytes, ad.data(), ad.size(),
                                                      nullptr, out, kek.uchar());
  return w;
}

/// Decrypts a wrapped data key. Errc::auth_failed for a wrong KEK, another cache id, or a
/// modified wrapped key.
[[nodiscard]] inline Result<SecretBytes> unwrap_data_key(const SecretBytes& kek, const WrappedKey& w,
                                                        const CacheId& cache) {
  if (auto s = ensure_sodium(); !s) return s.error();
  if (kek.size() != kKeyBytes) return fail(Errc::invalid_argument, "unwrap_data_key: KEK must be 32 bytes");
  auto key = SecretBytes::allocate(kKeyBytes);
  if (!key) return key.error();
  const auto* in = reinterpret_cast<const unsigned char*>(w.data());
  const auto ad = detail::wrap_ad(cache);
  if (crypto_aead_xchacha20poly1305_ietf_decrypt_detached(
          reinterpret_cast<unsigned char*>(key->writable().data()), nullptr, in + kNonceFieldBytes, kKeyBytes,
          in + kNonceFieldBytes + kKeyBytes, ad.data(), ad.size(), in, kek.uchar()) != 0)
    return fail(Errc::auth_failed, "data key does not unwrap with this key-encryption key and cache id");
  key->seal();
  return std::move(key).value();
}

// ---------------------------------------------------------------------------------------------
// Record cipher
// ---------------------------------------------------------------------------------------------

/// Encrypts/authenticates payloads under one cache's data key. Thread-safe (seal and open may
/// run concurrently from any number of threads). Move-only.
class RecordCipher {
 public:
  /// Derives the AEAD and MAC subkeys from `data_key` (32 bytes). Errc::unsupported when
  /// `aead` is AES-256-GCM and the CPU lacks AES-NI/PCLMUL.
  [[nodiscard]] static Result<RecordCipher> create(Aead aead, const SecretBytes& data_key) {
    if (auto s = ensure_sodium(); !s) return s.error();
    if (data_key.size() != kKeyBytes) return fail(Errc::invalid_argument, "data key must be 32 bytes");
    if (aead == Aead::aes256gcm && !aes256gcm_available())
      return fail(Errc::unsupported, "AES-256-GCM needs AES-NI and PCLMULQDQ, absent on this CPU");
    auto state = std::make_unique<State>();
    state->aead = aead;
    auto aead_key = SecretBytes::allocate(kKeyBytes);
    auto mac_key = SecretBytes::allocate(kKeyBytes);
    if (!aead_key) return aead_key.error();
    if (!mac_key) return mac_key.error();
    static constexpr char ctx[crypto_kdf_CONTEXTBYTES + 1] = "kvpackbk";
    crypto_kdf_derive_from_key(reinterpret_cast<unsigned char*>(aead_key->writable().data()), kKeyBytes, 1, ctx,
                               data_key.uchar());
    crypto_kdf_derive_from_key(reinterpret_cast<unsigned char*>(mac_key->writable().data()), kKeyBytes, 2, ctx,
                               data_key.uchar());
    if (aead == Aead::aes256gcm) {
      auto st = SecretBytes::allocate(sizeof(crypto_aead_aes256gcm_state));
      if (!st) return st.error();
      crypto_aead_aes256gcm_beforenm(reinterpret_cast<crypto_aead_aes256gcm_state*>(st->writable().data()),
                                     reinterpret_cast<const unsigned char*>(aead_key->bytes().data()));
      st->seal();
      state->gcm = std::move(st).value();
    }
    aead_key->seal();
    mac_key->seal();
    state->aead_key = std::move(aead_key).value();
    state->mac_key = std::move(mac_key).value();
    return RecordCipher(std::move(state));
  }

  [[nodiscard]] Aead aead() const noexcept { return s_->aead; }

  /// Protects `plain` into `cipher` (same size; may not alias) and writes the nonce field and
  /// tag. `ad` is authenticated, not encrypted.
  void seal(std::span<const std::byte> ad, std::span<const std::byte> plain,
            std::span<std::byte, kNonceFieldBytes> nonce, std::span<std::byte> cipher,
            std::span<std::byte, kTagBytes> tag) const {
    auto* n = reinterpret_cast<unsigned char*>(nonce.data());
    auto* c = reinterpret_cast<unsigned char*>(cipher.data());
    auto* t = reinterpret_cast<unsigned char*>(tag.data());
    const auto* m = reinterpret_cast<const unsigned char*>(plain.data());
    const auto* a = reinterpret_cast<const unsigned char*>(ad.data());
    switch (s_->aead) {
      case Aead::xchacha20poly1305:
        randombytes_buf(n, kNonceFieldBytes);
        crypto_aead_xchacha20poly1305_ietf_encrypt_detached(c, t, nullptr, m, plain.size(), a, ad.size(), nullptr,
                                                            n, s_->aead_key.uchar());
        break;
      case Aead::aes256gcm: {
        std::memset(n, 0, kNonceFieldBytes);
        const uint64_t counter = s_->gcm_counter.fetch_add(1, std::memory_order_relaxed);
        for (int i = 0; i < 8; ++i) n[i] = static_cast<unsigned char>(counter >> (8 * i));
        crypto_aead_aes256gcm_encrypt_detached_afternm(
            c, t, nullptr, m, plain.size(), a, ad.size(), nullptr, n,
            reinterpret_cast<const crypto_aead_aes256gcm_state*>(s_->gcm.bytes().data()));
        break;
      }
      case Aead::none:
        std::memset(n, 0, kNonceFieldBytes);
        if (!plain.empty()) std::memcpy(c, m, plain.size());
        mac(ad, plain, tag);
        break;
    }
  }

  /// Verifies and recovers the plaintext into `plain` (same size as `cipher`). On failure
  /// returns Errc::auth_failed and `plain` is all zeros: no unverified byte is ever exposed.
  [[nodiscard]] Status open(std::span<const std::byte> ad, std::span<const std::byte, kNonceFieldBytes> nonce,
                            std::span<const std::byte> cipher, std::span<const std::byte, kTagBytes> tag,
                            std::span<std::byte> plain) const {
    const auto* n = reinterpret_cast<const unsigned char*>(nonce.data());
    const auto* c = reinterpret_cast<const unsigned char*>(cipher.data());
    const auto* t = reinterpret_cast<const unsigned char*>(tag.data());
    const auto* a = reinterpret_cast<const unsigned char*>(ad.data());
    auto* m = reinterpret_cast<unsigned char*>(plain.data());
    int rc = -1;
    switch (s_->aead) {
      case Aead::xchacha20poly1305:
        rc = crypto_aead_xchacha20poly1305_ietf_decrypt_detached(m, nullptr, c, cipher.size(), t, a, ad.size(), n,
                                                                 s_->aead_key.uchar());
        break;
      case Aead::aes256gcm: {
        bool tail_zero = true;  // bytes 12..23 of the nonce field are unused and must be zero
        for (std::size_t i = crypto_aead_aes256gcm_NPUBBYTES; i < kNonceFieldBytes; ++i) tail_zero &= n[i] == 0;
        if (tail_zero)
          rc = crypto_aead_aes256gcm_decrypt_detached_afternm(
              m, nullptr, c, cipher.size(), t, a, ad.size(), n,
              reinterpret_cast<const crypto_aead_aes256gcm_state*>(s_->gcm.bytes().data()));
        break;
      }
      case Aead::none: {
        bool nonce_zero = true;
        for (std::size_t i = 0; i < kNonceFieldBytes; ++i) nonce_zero &= n[i] == 0;
        std::array<std::byte, kTagBytes> expect{};
        mac(ad, cipher, expect);
        if (nonce_zero && crypto_verify_16(reinterpret_cast<const unsigned char*>(expect.data()), t) == 0) {
          if (!cipher.empty()) std::memcpy(m, c, cipher.size());
          rc = 0;
        }
        break;
      }
    }
    if (rc != 0) {
      if (!plain.empty()) sodium_memzero(m, plain.size());
      return fail(Errc::auth_failed, std::string(to_string(s_->aead)) + " tag does not verify");
    }
    return {};
  }

 private:
  struct State {
    Aead aead = Aead::xchacha20poly1305;
    SecretBytes aead_key, mac_key, gcm;
    std::atomic<uint64_t> gcm_counter{1};
  };
  explicit RecordCipher(std::unique_ptr<State> s) : s_(std::move(s)) {}

  void mac(std::span<const std::byte> ad, std::span<const std::byte> data, std::span<std::byte, kTagBytes> out) const {
    crypto_generichash_state st;
    crypto_generichash_init(&st, s_->mac_key.uchar(), kKeyBytes, kTagBytes);
    crypto_generichash_update(&st, reinterpret_cast<const unsigned char*>(ad.data()), ad.size());
    crypto_generichash_update(&st, reinterpret_cast<const unsigned char*>(data.data()), data.size());
    crypto_generichash_final(&st, reinterpret_cast<unsigned char*>(out.data()), kTagBytes);
    sodium_memzero(&st, sizeof st);
  }

  std::unique_ptr<State> s_;
};

}  // namespace kvpack::offload
