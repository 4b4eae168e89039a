"""Run built modules: load, check arguments, call on the device, time, and the sample tests.
Imports describe and the shared helpers only, nothing of the build side."""
