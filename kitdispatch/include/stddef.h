/* kitdispatch (NVRTC): <stddef.h>. NVRTC declares size_t and ptrdiff_t itself. */
#ifndef KITDISPATCH_STDDEF_H
#define KITDISPATCH_STDDEF_H
#ifndef NULL
#define NULL 0
#endif
#ifndef offsetof
#define offsetof(type, member) __builtin_offsetof(type, member)
#endif
typedef decltype(nullptr) nullptr_t;
typedef long double max_align_t;
#endif
