// cuBLASLt is loaded when the first GPU context needs it, not when a meshrun binary starts.
//
// Linked directly, libcublasLt (540 MB) costs every process that merely contains the CUDA path
// about 0.3 s and 210 MB of resident memory in its own start-up, before main: every `meshrun`
// command and every CPU rank on a host whose build has CUDA. cublaslt_loader.cc therefore defines
// the cublasLt* functions the engine calls, with the header's exact signatures; each resolves its
// namesake in the library with dlopen/dlsym on first use and forwards to it. The binary does not
// link libcublasLt at all. A function the engine starts calling must be added there (the link
// fails until it is).
#pragma once

#include <string>
#include <vector>

namespace meshrun::gpu {

// Empty once cuBLASLt is loaded; otherwise why it could not be (dlopen's or dlsym's words),
// for error messages. Loads it if nothing has tried yet.
std::string CublasLtLoadError();

// The forwarded functions that the loaded library lacks (empty when every one resolves; all of
// them when the library is missing). For the loader's test.
std::vector<std::string> CublasLtUnresolved();

}  // namespace meshrun::gpu
