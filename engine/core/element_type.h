// The element type a library's templated ops, kernels and model are instantiated for. The
// product builds them for float only. The finite-difference gradient tests need float64: with
// MESHRUN_TESTS, CMake compiles the same sources a second time with MESHRUN_FLOAT64=1 into
// test-only twins (meshrun_float64_twin in cmake/MeshrunHelpers.cmake; decision 0067), which
// instantiate them for double. Definitions that are not templates stay out of a twin
// (#if !MESHRUN_FLOAT64): the product library holds them once.
#pragma once

#if MESHRUN_FLOAT64
#define MESHRUN_ELEMENT_TYPE double
#else
#define MESHRUN_ELEMENT_TYPE float
#endif
