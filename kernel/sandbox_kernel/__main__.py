"""``python -m sandbox_kernel -f {connection_file}``: launch the proxy kernel."""

from sandbox_kernel.app import main

if __name__ == "__main__":
    main()
