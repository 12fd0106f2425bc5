// Loading and checking TLS files and tokens (see tls.h). The PEM files are parsed with OpenSSL
// at start, so that a wrong file is an error naming its flag instead of a failed handshake later.
#include "common/tls.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

namespace meshrun {
namespace {

// The OpenSSL error queue as one line (and cleared).
std::string OpenSslError() {
  std::string out;
  while (unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out.empty() ? "not PEM" : out;
}

StatusOr<std::string> ReadFile(const std::string& flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return InvalidArgumentError(flag + ": cannot read '" + path + "': " + std::strerror(errno) +
                                " (hint: pass a readable PEM file)");
  }
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

struct BioDeleter {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Deleter {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyDeleter {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using BioPtr = std::unique_ptr<BIO, BioDeleter>;
using X509Ptr = std::unique_ptr<X509, X509Deleter>;
using KeyPtr = std::unique_ptr<EVP_PKEY, KeyDeleter>;

BioPtr MemoryBio(const std::string& pem) {
  return BioPtr(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

// The first certificate of `pem`, or an error naming `flag`.
StatusOr<X509Ptr> FirstCertificate(const std::string& flag, const std::string& path,
                                   const std::string& pem) {
  ERR_clear_error();
  BioPtr bio = MemoryBio(pem);
  X509Ptr cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
  if (!cert) {
    return InvalidArgumentError(flag + ": '" + path + "' holds no PEM certificate (" +
                                OpenSslError() +
                                ") (hint: pass the file that starts with -----BEGIN "
                                "CERTIFICATE-----)");
  }
  return cert;
}

}  // namespace

std::string HostOfAddress(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0) return "";
  std::string host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return host;
}

bool IsLoopbackAddress(const std::string& address) {
  if (address.rfind("unix:", 0) == 0 || address.rfind("unix-abstract:", 0) == 0) return true;
  std::string target = address;
  // gRPC target schemes: "dns:///host:port", "ipv4:host:port", "ipv6:[::1]:port".
  for (const char* scheme : {"dns:///", "dns:", "ipv4:", "ipv6:"}) {
    if (target.rfind(scheme, 0) == 0) {
      target = target.substr(std::strlen(scheme));
      break;
    }
  }
  std::string host = HostOfAddress(target);
  std::transform(host.begin(), host.end(), host.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  if (host == "localhost" || host == "::1" || host == "0:0:0:0:0:0:0:1") return true;
  // 127.0.0.0/8, written as a dotted quad.
  if (host.rfind("127.", 0) != 0) return false;
  int parts = 0;
  size_t start = 0;
  while (start <= host.size()) {
    const size_t dot = std::min(host.find('.', start), host.size());
    const std::string part = host.substr(start, dot - start);
    if (part.empty() || part.size() > 3 ||
        !std::all_of(part.begin(), part.end(), [](unsigned char c) { return std::isdigit(c); }) ||
        std::stoi(part) > 255) {
      return false;
    }
    ++parts;
    start = dot + 1;
  }
  return parts == 4;
}

StatusOr<TlsMaterial> LoadTls(const TlsFiles& files, bool need_cert_and_key, bool need_ca,
                              const TlsFlagNames& flags) {
  const std::string all = flags.cert + ", " + flags.key + " and " + flags.ca;
  if (need_cert_and_key) {
    if (files.cert.empty()) {
      return InvalidArgumentError(flags.cert + ": is required with TLS (hint: pass " + all + ")");
    }
    if (files.key.empty()) {
      return InvalidArgumentError(flags.key + ": is required with TLS (hint: pass " + all + ")");
    }
  } else if (files.cert.empty() != files.key.empty()) {
    const std::string& missing = files.cert.empty() ? flags.cert : flags.key;
    return InvalidArgumentError(missing + ": " + flags.cert + " and " + flags.key +
                                " go together (hint: pass both, or neither)");
  }
  if (need_ca && files.ca.empty()) {
    return InvalidArgumentError(flags.ca + ": is required with TLS (hint: pass " + all + ")");
  }
  TlsMaterial m;
  m.server_name = files.server_name;
  if (!files.cert.empty()) {
    MESHRUN_ASSIGN_OR_RETURN(m.cert_pem, ReadFile(flags.cert, files.cert));
    MESHRUN_ASSIGN_OR_RETURN(X509Ptr cert, FirstCertificate(flags.cert, files.cert, m.cert_pem));
    MESHRUN_ASSIGN_OR_RETURN(m.key_pem, ReadFile(flags.key, files.key));
    ERR_clear_error();
    BioPtr bio = MemoryBio(m.key_pem);
    KeyPtr key(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
    if (!key) {
      return InvalidArgumentError(flags.key + ": '" + files.key +
                                  "' holds no unencrypted PEM private key (" + OpenSslError() +
                                  ") (hint: pass the key file of " + flags.cert +
                                  ", without a passphrase)");
    }
    if (X509_check_private_key(cert.get(), key.get()) != 1) {
      ERR_clear_error();
      return InvalidArgumentError(flags.key + ": '" + files.key +
                                  "' is not the private key of the certificate '" + files.cert +
                                  "' (hint: pass the key the certificate was issued for)");
    }
  }
  if (!files.ca.empty()) {
    MESHRUN_ASSIGN_OR_RETURN(m.ca_pem, ReadFile(flags.ca, files.ca));
    MESHRUN_ASSIGN_OR_RETURN(X509Ptr ca, FirstCertificate(flags.ca, files.ca, m.ca_pem));
  }
  return m;
}

std::shared_ptr<grpc::ServerCredentials> ServerCredentials(const TlsMaterial& material) {
  grpc::SslServerCredentialsOptions options(GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
  options.pem_root_certs = material.ca_pem;
  options.pem_key_cert_pairs.push_back({material.key_pem, material.cert_pem});
  return grpc::SslServerCredentials(options);
}

std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials(const TlsMaterial* material) {
  if (material == nullptr) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = material->ca_pem;
  options.pem_private_key = material->key_pem;
  options.pem_cert_chain = material->cert_pem;
  return grpc::SslCredentials(options);
}

void ApplyServerName(const TlsMaterial* material, grpc::ChannelArguments* args) {
  if (material != nullptr && !material->server_name.empty()) {
    args->SetSslTargetNameOverride(material->server_name);
  }
}

Status CheckPlaintextTarget(const std::string& flag, const std::string& target, bool tls,
                            bool insecure, const std::string& tls_hint) {
  if (tls || insecure || IsLoopbackAddress(target)) return OkStatus();
  return InvalidArgumentError(flag + ": " + target +
                              " is not loopback and no TLS is configured (hint: pass " + tls_hint +
                              ", or --insecure on a trusted network)");
}

StatusOr<std::vector<std::string>> ReadTokenFile(const std::string& flag, const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return InvalidArgumentError(flag + ": cannot read '" + path + "': " + std::strerror(errno) +
                                " (hint: pass a readable file with one token per line)");
  }
  std::vector<std::string> tokens;
  std::string line;
  while (std::getline(in, line)) {
    const size_t begin = line.find_first_not_of(" \t\r");
    if (begin == std::string::npos || line[begin] == '#') continue;
    const size_t end = line.find_last_not_of(" \t\r");
    tokens.push_back(line.substr(begin, end - begin + 1));
  }
  if (tokens.empty()) {
    return InvalidArgumentError(flag + ": '" + path +
                                "' holds no token (hint: one token per line; lines starting "
                                "with # are comments; e.g. openssl rand -hex 32 > FILE)");
  }
  return tokens;
}

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  // Every byte of `a` is looked at whatever `b` holds; a length difference counts as a
  // difference without an early return.
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) {
    const unsigned char other = b.empty() ? 0 : static_cast<unsigned char>(b[i % b.size()]);
    diff |= static_cast<unsigned char>(a[i]) ^ other;
  }
  return diff == 0;
}

std::string BearerToken(std::string_view header) {
  constexpr std::string_view kScheme = "bearer ";
  if (header.size() <= kScheme.size()) return "";
  for (size_t i = 0; i < kScheme.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(header[i])) != kScheme[i]) return "";
  }
  std::string_view token = header.substr(kScheme.size());
  while (!token.empty() && token.front() == ' ') token.remove_prefix(1);
  while (!token.empty() && (token.back() == ' ' || token.back() == '\r')) token.remove_suffix(1);
  return std::string(token);
}

}  // namespace meshrun
