# Development shell for dflash: `nix develop`, then `just test` (README "Nix shell").
#
# Nix provides the interpreter and the tools; the Python environment itself still
# comes from uv.lock (`just setup`), exactly as everywhere else. nixpkgs is pinned to
# a revision of the nixos-25.11 branch (the one home-manager's release-25.11 branch
# locks). No flake.lock is committed yet: Nix could not be run where this was
# written, and a lock's narHash must be computed, not copied. The first `nix
# develop` writes flake.lock; commit it.
{
  description = "dflash dev shell: Python 3.11, uv and just, environments from uv.lock";

  inputs.nixpkgs.url = "github:NixOS/nixpkgs/687f05a9184cad4eaf905c48b63649e3a86f5433";

  outputs =
    { self, nixpkgs }:
    let
      # uv.lock only resolves for x86_64 Linux (pyproject.toml required-environments).
      systems = [ "x86_64-linux" ];
      forAllSystems = f: nixpkgs.lib.genAttrs systems (system: f nixpkgs.legacyPackages.${system});
    in
    {
      devShells = forAllSystems (
        pkgs:
        let
          python = pkgs.python311;
          # Libraries manylinux wheels (torch, numpy, tokenizers) expect from the OS.
          wheelLibs = pkgs.lib.makeLibraryPath [
            pkgs.stdenv.cc.cc.lib
            pkgs.zlib
          ];
        in
        {
          default = pkgs.mkShell {
            packages = [
              python
              pkgs.uv
              pkgs.just
              pkgs.git
              pkgs.gcc # Triton and inductor compile kernels at run time
            ];

            UV_PYTHON = "${python}/bin/python3.11";
            UV_PYTHON_DOWNLOADS = "never";

            # The NVIDIA driver is the host's. NixOS exposes it in /run/opengl-driver/lib;
            # elsewhere only the driver's own libraries (libcuda, libnvidia-*) are linked
            # into a private directory, never the host's whole lib directory, whose glibc
            # and libstdc++ would clash with Nix's. The CUDA user-space libraries come
            # from the locked nvidia-* wheels, as in the images.
            shellHook = ''
              if [ -d /run/opengl-driver/lib ]; then
                dflash_driver_libs=/run/opengl-driver/lib
              else
                dflash_driver_libs="''${XDG_CACHE_HOME:-$HOME/.cache}/dflash/host-driver-libs"
                mkdir -p "$dflash_driver_libs"
                for dir in /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/lib /usr/lib/wsl/lib; do
                  for lib in "$dir"/libcuda.so* "$dir"/libnvidia-*.so*; do
                    if [ -e "$lib" ]; then ln -sf "$lib" "$dflash_driver_libs/"; fi
                  done
                done
              fi
              export LD_LIBRARY_PATH="$dflash_driver_libs:${wheelLibs}''${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
              unset dflash_driver_libs
            '';
          };
        }
      );
    };
}
