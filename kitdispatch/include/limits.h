/* kitdispatch (NVRTC): <limits.h> for x86-64 Linux (LP64, signed char). */
#ifndef KITDISPATCH_LIMITS_H
#define KITDISPATCH_LIMITS_H
#if __has_include(<cuda/std/climits>)
/* CCCL defines these names itself under NVRTC: take its definitions, so that one TU
   may include both without conflicting redefinitions. */
#include <cuda/std/climits>
#else
#define CHAR_BIT 8
#define SCHAR_MIN (-128)
#define SCHAR_MAX 127
#define UCHAR_MAX 255
#define CHAR_MIN SCHAR_MIN
#define CHAR_MAX SCHAR_MAX
#define MB_LEN_MAX 16
#define SHRT_MIN (-32768)
#define SHRT_MAX 32767
#define USHRT_MAX 65535
#define INT_MIN (-INT_MAX - 1)
#define INT_MAX 2147483647
#define UINT_MAX 4294967295U
#define LONG_MIN (-LONG_MAX - 1L)
#define LONG_MAX 9223372036854775807L
#define ULONG_MAX 18446744073709551615UL
#define LLONG_MIN (-LLONG_MAX - 1LL)
#define LLONG_MAX 9223372036854775807LL
#define ULLONG_MAX 18446744073709551615ULL
#endif
#endif
