// The preprocessor machinery of the op table (engine/ops/op_table.inc): each op's parameters are
// written once there as (type, name) or (type, name, default) and expanded from it into the
// declarations of engine/ops/ops.h and engine/kernels/cpu/kernels.h, the dispatch of
// engine/ops/dispatch.cc and the explicit instantiations (decision 0067).
#pragma once

// A parameter of a row as it appears in a declaration (with its default), in a definition, as a
// type (explicit instantiations) and as an argument (the dispatch's calls).
#define MESHRUN_PARAM_DECL(type, name, ...) type name __VA_OPT__(= __VA_ARGS__)
#define MESHRUN_PARAM_DEF(type, name, ...) type name
#define MESHRUN_PARAM_TYPE(type, name, ...) type
#define MESHRUN_PARAM_NAME(type, name, ...) name

// Up to 20 arguments.
#define MESHRUN_PP_CAT(a, b) MESHRUN_PP_CAT_(a, b)
#define MESHRUN_PP_CAT_(a, b) a##b
#define MESHRUN_PP_NARGS(...)                                                                     \
  MESHRUN_PP_NARGS_(__VA_ARGS__, 20, 19, 18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, \
                    2, 1)
#define MESHRUN_PP_NARGS_(_1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13, _14, _15, _16, \
                          _17, _18, _19, _20, n, ...)                                            \
  n
// f applied to each argument, joined by commas (LIST) or by nothing (EACH).
#define MESHRUN_PP_LIST(f, ...) \
  MESHRUN_PP_CAT(MESHRUN_PP_LIST_, MESHRUN_PP_NARGS(__VA_ARGS__))(f, __VA_ARGS__)
#define MESHRUN_PP_EACH(f, ...) \
  MESHRUN_PP_CAT(MESHRUN_PP_EACH_, MESHRUN_PP_NARGS(__VA_ARGS__))(f, __VA_ARGS__)
#define MESHRUN_PP_LIST_1(f, x) f x
#define MESHRUN_PP_EACH_1(f, x) f(x)
#define MESHRUN_PP_LIST_2(f, x, ...) f x, MESHRUN_PP_LIST_1(f, __VA_ARGS__)
#define MESHRUN_PP_LIST_3(f, x, ...) f x, MESHRUN_PP_LIST_2(f, __VA_ARGS__)
#define MESHRUN_PP_LIST_4(f, x, ...) f x, MESHRUN_PP_LIST_3(f, __VA_ARGS__)
#define MESHRUN_PP_LIST_5(f, x, ...) f x, MESHRUN_PP_LIST_4(f, __VA_ARGS__)
#define MESHRUN_PP_LIST_6(f, x, ...) f x, MESHRUN_PP_LIST_5(f, __VA_ARGS__)
#define MESHRUN_PP_LIST_7(f, x, ...) f x, MESHRUN_PP_LIST_6(f, __VA_ARGS__)
#define MESHRUN_PP_LIST_8(f, x, ...) f x, MESHRUN_PP_LIST_7(f, __VA_ARGS__)
#define MESHRUN_PP_LIST_9(f, x, ...) f x, MESHRUN_PP_LIST_8(f, __VA_ARGS__)
#define MESHRUN_PP_LIST_10(f, x, ...) f x, MESHRUN_PP_LIST_9(f, __VA_ARGS__)
#define MESHRUN_PP_LIST_11(f, x, ...) f x, MESHRUN_PP_LIST_10(f, __VA_ARGS__)
#define MESHRUN_PP_LIST_12(f, x, ...) f x, MESHRUN_PP_LIST_11(f, __VA_ARGS__)
#define MESHRUN_PP_LIST_13(f, x, ...) f x, MESHRUN_PP_LIST_12(f, __VA_ARGS__)
#define MESHRUN_PP_LIST_14(f, x, ...) f x, MESHRUN_PP_LIST_13(f, __VA_ARGS__)
#define MESHRUN_PP_LIST_15(f, x, ...) f x, MESHRUN_PP_LIST_14(f, __VA_ARGS__)
#define MESHRUN_PP_LIST_16(f, x, ...) f x, MESHRUN_PP_LIST_15(f, __VA_ARGS__)
#define MESHRUN_PP_LIST_17(f, x, ...) f x, MESHRUN_PP_LIST_16(f, __VA_ARGS__)
#define MESHRUN_PP_LIST_18(f, x, ...) f x, MESHRUN_PP_LIST_17(f, __VA_ARGS__)
#define MESHRUN_PP_LIST_19(f, x, ...) f x, MESHRUN_PP_LIST_18(f, __VA_ARGS__)
#define MESHRUN_PP_LIST_20(f, x, ...) f x, MESHRUN_PP_LIST_19(f, __VA_ARGS__)
#define MESHRUN_PP_EACH_2(f, x, ...) f(x) MESHRUN_PP_EACH_1(f, __VA_ARGS__)
#define MESHRUN_PP_EACH_3(f, x, ...) f(x) MESHRUN_PP_EACH_2(f, __VA_ARGS__)
#define MESHRUN_PP_EACH_4(f, x, ...) f(x) MESHRUN_PP_EACH_3(f, __VA_ARGS__)
#define MESHRUN_PP_EACH_5(f, x, ...) f(x) MESHRUN_PP_EACH_4(f, __VA_ARGS__)
#define MESHRUN_PP_EACH_6(f, x, ...) f(x) MESHRUN_PP_EACH_5(f, __VA_ARGS__)
#define MESHRUN_PP_EACH_7(f, x, ...) f(x) MESHRUN_PP_EACH_6(f, __VA_ARGS__)
#define MESHRUN_PP_EACH_8(f, x, ...) f(x) MESHRUN_PP_EACH_7(f, __VA_ARGS__)
#define MESHRUN_PP_EACH_9(f, x, ...) f(x) MESHRUN_PP_EACH_8(f, __VA_ARGS__)
#define MESHRUN_PP_EACH_10(f, x, ...) f(x) MESHRUN_PP_EACH_9(f, __VA_ARGS__)
#define MESHRUN_PP_EACH_11(f, x, ...) f(x) MESHRUN_PP_EACH_10(f, __VA_ARGS__)
#define MESHRUN_PP_EACH_12(f, x, ...) f(x) MESHRUN_PP_EACH_11(f, __VA_ARGS__)
#define MESHRUN_PP_EACH_13(f, x, ...) f(x) MESHRUN_PP_EACH_12(f, __VA_ARGS__)
#define MESHRUN_PP_EACH_14(f, x, ...) f(x) MESHRUN_PP_EACH_13(f, __VA_ARGS__)
#define MESHRUN_PP_EACH_15(f, x, ...) f(x) MESHRUN_PP_EACH_14(f, __VA_ARGS__)
#define MESHRUN_PP_EACH_16(f, x, ...) f(x) MESHRUN_PP_EACH_15(f, __VA_ARGS__)
#define MESHRUN_PP_EACH_17(f, x, ...) f(x) MESHRUN_PP_EACH_16(f, __VA_ARGS__)
#define MESHRUN_PP_EACH_18(f, x, ...) f(x) MESHRUN_PP_EACH_17(f, __VA_ARGS__)
#define MESHRUN_PP_EACH_19(f, x, ...) f(x) MESHRUN_PP_EACH_18(f, __VA_ARGS__)
#define MESHRUN_PP_EACH_20(f, x, ...) f(x) MESHRUN_PP_EACH_19(f, __VA_ARGS__)
