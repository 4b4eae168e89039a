/* kitdispatch (NVRTC): <stdio.h>. NVRTC declares the device printf itself. */
#ifndef KITDISPATCH_STDIO_H
#define KITDISPATCH_STDIO_H
#include <stddef.h>
#endif
