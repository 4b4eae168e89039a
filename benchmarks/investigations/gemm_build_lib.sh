# Shared by the investigation build scripts (source it): nvcc 13, sm_90a cubins.
# build_matmul_nt OUT NAME ROOT "DEFINES" [FLAGS...]: OUT/NAME/matmul_nt.cubin from ROOT/kernels/matmul/matmul_nt.cu
build_matmul_nt() {
  local out=$1 name=$2 root=$3 defines=$4
  shift 4
  mkdir -p "$out/$name"
  nvcc -arch=sm_90a -cubin -O3 -std=c++17 $defines "$@" "$root/kernels/matmul/matmul_nt.cu" -o "$out/$name/matmul_nt.cubin"
}
