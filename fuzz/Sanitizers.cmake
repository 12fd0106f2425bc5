# Included by the top-level CMakeLists.txt when MESHRUN_FUZZ is on and the compiler is clang,
# before any target is defined: every library of ours (and the generated protobuf code) is
# compiled with libFuzzer's coverage instrumentation and ASan + UBSan; the Debian libraries
# (yaml-cpp, protobuf, gRPC, SQLite) stay as built by gcc and are linked normally. Only the
# fuzz targets link libFuzzer itself (fuzz/CMakeLists.txt adds -fsanitize=fuzzer).
set(MESHRUN_SANITIZE_FLAGS
    -fsanitize=address,undefined -fno-sanitize-recover=undefined

    -fno-omit-frame-pointer -g)
add_compile_options(-fsanitize=fuzzer-no-link ${MESHRUN_SANITIZE_FLAGS})
add_link_options(-fsanitize=address,undefined)
