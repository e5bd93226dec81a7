# ddp_train as a Spack package. From a checkout (there are no release tarballs):
#   spack repo add <checkout>/spack
#   spack env create -d env && spack -e env add ddp-train@0.1.0 ~cuda
#   spack -e env develop --path <checkout> ddp-train@0.1.0 && spack -e env install
# ~cuda: host Kokkos + oneDNN; +cuda cuda_arch=90: a CUDA Kokkos (nvcc_wrapper),
# cuBLAS, cuDNN and NCCL, no oneDNN.
# tests/module/check_spack_recipe.py checks that every CMake option of the project
# is set below or listed in CMAKE_OPTIONS_NOT_EXPOSED.

from spack.package import *

try:  # Spack >= 1.0 keeps the build systems in its builtin repository
    from spack_repo.builtin.build_systems.cmake import CMakePackage
    from spack_repo.builtin.build_systems.cuda import CudaPackage
except ImportError:  # Spack 0.x exports them from spack.package
    pass

# The project's CMake options and cache variables that the recipe leaves alone, and why.
CMAKE_OPTIONS_NOT_EXPOSED = {
    "CMAKE_BUILD_TYPE": "Spack's build_type variant (CMakePackage) sets it",
    "DDP_SANITIZE": "ASan/UBSan build for the project's own test job, not for installs",
    "DDP_PRECOMPILE_HEADERS": "compile time only (on in the host build, off in the CUDA build): the same binaries",
    "DDP_LINK_GOLD": "link time only (gold where the compiler takes it, host build): programs that do the same",
    "DDP_GIT_REVISION": "--version asks git at build time; a `spack develop` checkout has one",
    "DDP_MODULE_PREREQ": "the project's own modulefile; Spack writes its modules (spack module tcl/lmod refresh)",
    "DDP_MODULEFILE_DIR": "same: where the project's own modulefile goes under the prefix",
    "DDP_KOKKOS_INCLUDE_DIR": "found from Kokkos's CMake config, which CMAKE_PREFIX_PATH points at",
    "DDP_CUDNN_LIBRARY": "found under CUDNN_ROOT, set below",
    "DDP_CUDNN_INCLUDE_DIR": "found under CUDNN_ROOT, set below",
    "DDP_NCCL_LIBRARY": "found under NCCL_ROOT, set below",
    "DDP_NCCL_INCLUDE_DIR": "found under NCCL_ROOT, set below",
    "DDP_OPENBLAS_LIBRARY": "gemm_bench's optional comparison; OpenBLAS is no dependency",
    "DDP_OPENBLAS_INCLUDE_DIR": "same",
    "DDP_TEST_TIMEOUT": "test suite only (its default suits `spack install --test`)",
    "DDP_TORCH_PYTHON": "test suite only: the PyTorch comparisons skip without torch",
    "DDP_TB_PYTHON": "test suite only: the TensorBoard read-back skips without the tensorboard package",
    "DDP_TOKENIZERS_PYTHON": "test suite only: the BPE test skips without Hugging Face's tokenizers",
    "DDP_HYDRA": "test suite only: MPICH's mpiexec.hydra, another MPI's launcher; its test skips without it",
    "DDP_TOOLS_PYTHON": "test suite only: the image tools' tests are left out without PIL",
}


class DdpTrain(CMakePackage, CudaPackage):
    """Data-parallel neural-network trainer: one SPMD MPI program configured by a
    Fortran namelist, reading HDF5 shards in parallel, with Kokkos kernels and
    oneDNN (CPU) or cuBLAS/cuDNN/NCCL (GPU)."""

    # Sources come from a checkout (spack develop); this is the project's version.
    version("0.1.0")

    variant("tools", default=True,
            description="Python tools (data preparation, plot_metrics) and their modules")

    depends_on("c", type="build")
    depends_on("cxx", type="build")
    depends_on("cmake@3.20:", type="build")
    depends_on("mpi")
    depends_on("hdf5+mpi")  # shards are read through the MPI-IO driver
    depends_on("kokkos@3.4:")
    depends_on("kokkos~cuda", when="~cuda")
    depends_on("onednn", when="~cuda")  # the host GEMMs and convolutions; the GPU build does not link it

    # +cuda: Kokkos runs its kernels on the GPU and compiles ddp_train with its nvcc_wrapper;
    # Kokkos takes one architecture, so the build does too.
    conflicts("+cuda", when="cuda_arch=none", msg="+cuda needs a cuda_arch, e.g. cuda_arch=90")
    for _arch in CudaPackage.cuda_arch_values:
        depends_on(f"kokkos@4:+cuda+wrapper cuda_arch={_arch}", when=f"+cuda cuda_arch={_arch}")
    depends_on("cudnn", when="+cuda")
    depends_on("nccl", when="+cuda")

    depends_on("python@3:", type="run", when="+tools")
    depends_on("py-numpy", type="run", when="+tools")
    depends_on("py-h5py", type="run", when="+tools")
    depends_on("py-matplotlib", type="run", when="+tools")

    depends_on("googletest", type="test")
    depends_on("python@3:", type="test")
    depends_on("py-numpy", type="test")
    depends_on("py-h5py", type="test")
    depends_on("py-matplotlib", type="test")

    def cmake_args(self):
        spec = self.spec
        args = [
            self.define_from_variant("DDP_ENABLE_CUDA", "cuda"),
            # Off in ~cuda even when an nvcc is on PATH (it would then demand cuDNN and NCCL).
            self.define_from_variant("DDP_ENABLE_CUDA_GLUE", "cuda"),
            self.define("DDP_BUILD_TESTS", self.run_tests),
            # Spack's compiler wrappers add the flags of the spec's target already.
            self.define("DDP_NATIVE_ARCH", False),
        ]
        if self.run_tests:
            args.append(self.define("DDP_PYTHON", spec["python"].command.path))
        if spec.satisfies("+cuda"):
            args += [
                self.define("CMAKE_CXX_COMPILER", spec["kokkos"].kokkos_cxx),
                self.define("CMAKE_CUDA_ARCHITECTURES", spec.variants["cuda_arch"].value),
                self.define("CUDAToolkit_ROOT", spec["cuda"].prefix),
                self.define("CUDNN_ROOT", spec["cudnn"].prefix),
                self.define("NCCL_ROOT", spec["nccl"].prefix),
            ]
        else:
            onednn = spec["onednn"].prefix
            args += [
                self.define("DDP_DNNL_INCLUDE_DIR", onednn.include),
                self.define("DDP_DNNL_LIBRARY",
                            find_libraries("libdnnl", root=onednn, shared=True, recursive=True)[0]),
            ]
        return args
