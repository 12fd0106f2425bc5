// Credentials of meshrun's gRPC connections, loaded once at start: the PEM files of TLS and
// mutual TLS (--tls-cert, --tls-key, --tls-ca), the bearer tokens of the client API
// (--token-file, MESHRUN_TOKEN), and the rule that plaintext is only for loopback addresses.
// Shared by the coordinator (server credentials), the worker and its ranks (client
// certificates) and the client (CA and token). See docs/security.md.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace grpc {
class ChannelArguments;
class ChannelCredentials;
class ServerCredentials;
}  // namespace grpc

namespace meshrun {

// What a worker passes to the ranks it starts, so that they reach the coordinator's store as
// that worker (its client certificate); read by GrpcStore's user (client/train_command.cc).
inline constexpr char kEnvTlsCert[] = "MESHRUN_TLS_CERT";
inline constexpr char kEnvTlsKey[] = "MESHRUN_TLS_KEY";
// Also the client's default for --tls-ca.
inline constexpr char kEnvTlsCa[] = "MESHRUN_TLS_CA";
inline constexpr char kEnvTlsServerName[] = "MESHRUN_TLS_SERVER_NAME";
// The client's bearer token, and the file to read it from (first line).
inline constexpr char kEnvToken[] = "MESHRUN_TOKEN";
inline constexpr char kEnvTokenFile[] = "MESHRUN_TOKEN_FILE";

// The metadata key of the bearer token ("authorization: Bearer <token>").
inline constexpr char kAuthorizationHeader[] = "authorization";

// Paths of PEM files, as given on the command line; all empty: no TLS.
struct TlsFiles {
  std::string cert;  // --tls-cert: this side's certificate chain
  std::string key;   // --tls-key: its private key
  std::string ca;    // --tls-ca: the CA that signs the other side's certificates
  // Overrides the name checked against the server's certificate (client side only).
  std::string server_name;

  bool any() const { return !cert.empty() || !key.empty() || !ca.empty(); }
};

// The contents of the files of a TlsFiles.
struct TlsMaterial {
  std::string cert_pem, key_pem, ca_pem;
  std::string server_name;
};

// The host of "HOST:PORT" or "[V6]:PORT" (without brackets); "" when there is no port.
std::string HostOfAddress(const std::string& address);

// True when `address` can only be reached from this machine: 127.0.0.0/8, ::1, "localhost",
// and unix: sockets. A wildcard (0.0.0.0, [::]) and every other host are not loopback.
bool IsLoopbackAddress(const std::string& address);

// Reads the PEM files of `files` (flag names as in `flags`, e.g. {"--tls-cert", "--tls-key",
// "--tls-ca"}). Which are required: `need_cert_and_key` (server, worker) and `need_ca`.
// INVALID_ARGUMENT naming the flag for a missing flag, a file that cannot be read, or one that
// holds no PEM block of the expected kind.
struct TlsFlagNames {
  std::string cert = "--tls-cert", key = "--tls-key", ca = "--tls-ca";
};
StatusOr<TlsMaterial> LoadTls(const TlsFiles& files, bool need_cert_and_key, bool need_ca,
                              const TlsFlagNames& flags = TlsFlagNames());

// Server credentials: this side's certificate and key; client certificates are requested and,
// when presented, verified against ca_pem (GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY), so
// a client without a certificate (the CLI, with a token) connects while workers present theirs.
std::shared_ptr<grpc::ServerCredentials> ServerCredentials(const TlsMaterial& material);

// Channel credentials: TLS verifying the server against ca_pem, presenting cert/key when set;
// insecure when `material` is null.
std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials(const TlsMaterial* material);
// Sets the name checked against the server's certificate when material.server_name is set.
void ApplyServerName(const TlsMaterial* material, grpc::ChannelArguments* args);

// The plaintext rule for a client side (worker, rank, CLI) dialling `target`: OK with TLS, or on
// loopback, or with `insecure`; otherwise INVALID_ARGUMENT naming `flag`.
Status CheckPlaintextTarget(const std::string& flag, const std::string& target, bool tls,
                            bool insecure, const std::string& tls_hint);

// ---- Bearer tokens ------------------------------------------------------------------------

// Every token of a token file: one per line, surrounding whitespace trimmed, blank lines and
// lines starting with '#' skipped. INVALID_ARGUMENT naming `flag` when the file cannot be read
// or holds no token.
StatusOr<std::vector<std::string>> ReadTokenFile(const std::string& flag, const std::string& path);

// Equality whose running time depends only on the lengths, not on where the strings differ.
bool ConstantTimeEquals(std::string_view a, std::string_view b);

// The token of an "authorization" header value "Bearer <token>" (scheme case-insensitive);
// "" when the value has another form.
std::string BearerToken(std::string_view header);

}  // namespace meshrun
