/* kitdispatch (NVRTC): NVRTC defines assert() itself, calling its device __assertfail. */
