// The CPU backend: Gloo over TCP (Debian's libgloo 2022-05). Groups bootstrap through our Store
// (adapted to gloo::rendezvous::Store) and connect a full mesh of TCP pairs. Built only when
// MESHRUN_ENGINE_ONLY is OFF (library meshrun_comm_gloo); no Gloo type leaks from this header.
#pragma once

#include <memory>
#include <string>

#include "engine/comm/communicator.h"

namespace gloo::transport {
class Device;
}  // namespace gloo::transport

namespace meshrun {

struct GlooOptions {
  // The address peers reach this process at; the TCP listeners bind to it.
  std::string hostname = "127.0.0.1";
  // A network interface (e.g. "eth0") to take the address from instead; wins when set.
  std::string iface;
};

// Owns one Gloo TCP device (one I/O thread) shared by every communicator it connects.
// Communicators keep the device alive. Thread-safe.
//
// Ops: all_reduce, all_gather, broadcast and barrier are Gloo's own (gloo::allreduce ring, …);
// reduce_scatter is a ring over Gloo's unbound buffers (this Gloo has no timeout-aware
// reduce-scatter); send/recv use unbound buffers with per-direction sequence slots. Gloo's
// exceptions stop at this backend: a timeout becomes DEADLINE_EXCEEDED, a closed or reset
// connection (a dead peer) UNAVAILABLE, anything else INTERNAL.
class GlooBackend : public CommBackend {
 public:
  // UNAVAILABLE when the hostname or interface cannot be resolved. Sets SIGPIPE to SIG_IGN when
  // it is at its default (as Python does), so that a peer dying mid-write surfaces as an
  // UNAVAILABLE status instead of killing this process.
  static StatusOr<std::shared_ptr<GlooBackend>> Create(const GlooOptions& options = {});

  std::string name() const override { return "gloo"; }
  StatusOr<std::unique_ptr<Communicator>> Connect(const CommConfig& config,
                                                  std::shared_ptr<Store> store) override;

 private:
  explicit GlooBackend(std::shared_ptr<gloo::transport::Device> device)
      : device_(std::move(device)) {}

  std::shared_ptr<gloo::transport::Device> device_;
};

}  // namespace meshrun
