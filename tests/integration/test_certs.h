// Throwaway certificates for the TLS tests, made with the `openssl` command line at test time:
// a CA, a coordinator server certificate for localhost / 127.0.0.1, client certificates whose
// CN is a worker name, and a "rogue" client certificate issued by a second, unrelated CA.
// EC P-256 keys, so that generating them all takes well under a second.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace meshrun::testing {

class TestCerts {
 public:
  // False (with `error` set) when openssl is missing or fails; the caller skips.
  // `coordinator_sans` adds subjectAltNames to the coordinator's ("IP:10.0.0.1").
  bool Generate(const std::filesystem::path& dir, const std::vector<std::string>& workers,
                const std::vector<std::string>& coordinator_sans = {}) {
    dir_ = dir;
    std::filesystem::create_directories(dir_);
    if (std::system("openssl version >/dev/null 2>&1") != 0) {
      error = "the openssl command is missing (apt-get install openssl)";
      return false;
    }
    bool ok = MakeCa("ca") && MakeCa("other-ca") &&
              MakeLeaf("coordinator", "ca",
                       "subjectAltName=DNS:localhost,IP:127.0.0.1" + ExtraSans(coordinator_sans) +
                           "\nextendedKeyUsage=serverAuth\n") &&
              MakeLeaf("rogue", "other-ca", "extendedKeyUsage=clientAuth\n");
    for (const std::string& w : workers) {
      ok = ok && MakeLeaf(w, "ca", "extendedKeyUsage=clientAuth\n");
    }
    return ok;
  }

  std::string cert(const std::string& name) const { return (dir_ / (name + ".crt")).string(); }
  std::string key(const std::string& name) const { return (dir_ / (name + ".key")).string(); }
  std::string ca() const { return cert("ca"); }

  std::string error;

 private:
  bool Run(const std::string& command) {
    const std::string full = "cd '" + dir_.string() + "' && " + command + " >>openssl.log 2>&1";
    if (std::system(full.c_str()) != 0) {
      error = "failed: " + command + " (see " + (dir_ / "openssl.log").string() + ")";
      return false;
    }
    return true;
  }
  static std::string ExtraSans(const std::vector<std::string>& sans) {
    std::string out;
    for (const std::string& s : sans) out += "," + s;
    return out;
  }
  static std::string NewKey() { return " -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"; }
  bool MakeCa(const std::string& name) {
    return Run("openssl req -x509" + NewKey() + " -keyout " + name + ".key -out " + name +
               ".crt -days 2 -subj /CN=" + name +
               " -addext basicConstraints=critical,CA:TRUE"
               " -addext keyUsage=critical,keyCertSign,cRLSign");
  }
  bool MakeLeaf(const std::string& name, const std::string& ca, const std::string& ext) {
    std::ofstream(dir_ / (name + ".ext")) << ext;
    return Run("openssl req" + NewKey() + " -keyout " + name + ".key -out " + name +
               ".csr -subj /CN=" + name) &&
           Run("openssl x509 -req -in " + name + ".csr -CA " + ca + ".crt -CAkey " + ca +
               ".key -CAcreateserial -out " + name + ".crt -days 2 -extfile " + name + ".ext");
  }

  std::filesystem::path dir_;
};

}  // namespace meshrun::testing
