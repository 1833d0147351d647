"""The warm pool: sandboxes started ahead of time, handed to new kernels over a unix socket."""
