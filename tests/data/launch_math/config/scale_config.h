// Found only through the scale_grid_stride kernel's include_dirs = ["config"].
#pragma once
#ifndef SCALE
#error "SCALE comes from the kernel's defines in kitdispatch.toml"
#endif
#define SCALED(v) ((v) * SCALE)
