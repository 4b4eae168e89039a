/* kitdispatch (NVRTC): the types glibc's <sys/types.h> gives (x86-64 Linux, LP64). */
#ifndef KITDISPATCH_SYS_TYPES_H
#define KITDISPATCH_SYS_TYPES_H
typedef unsigned int uint;
typedef unsigned short ushort;
typedef unsigned long ulong;
typedef unsigned char u_char;
typedef unsigned short u_short;
typedef unsigned int u_int;
typedef unsigned long u_long;
typedef unsigned char u_int8_t;
typedef unsigned short u_int16_t;
typedef unsigned int u_int32_t;
typedef unsigned long u_int64_t;
typedef long ssize_t;
typedef long off_t;
#endif
