"""Compile: NVRTC, nvcc and nvFatbin per architecture, the toolchain they come from, C++ entry
names, the entry bridge and the object cache."""
