/*
 * hvdscale: MKL takes its Intel code path on any x86 CPU (LD_PRELOAD shim, issue 32).
 *
 * torch's fp32 matrix products (torch.mm, Linear) call the MKL statically linked into
 * libtorch_cpu.so. MKL picks its kernels by CPU vendor: it asks mkl_serv_intel_cpu_true()
 * whether the CPU is an Intel one, and on any other (an AMD EPYC here) it takes a generic
 * code path that ignores AVX2/AVX-512 (since MKL 2020.1 MKL_DEBUG_CPU_TYPE no longer
 * changes that). Measured on this machine's AMD EPYC (AVX-512), one thread, torch 2.13:
 * 1000x600 @ 600x192 took 2,169 us on the vendor path and 978 us with this library, the
 * speed of TensorFlow's oneDNN/Eigen kernel (992 us).
 *
 * This library defines that one function and answers yes; libtorch_cpu.so calls it
 * through its symbol table, so the preloaded definition wins. On the Intel path MKL still
 * chooses among its kernels by the instruction sets the CPU reports (cpuid), so it runs
 * only instructions the CPU has. The counter hvdscale_mkl_intel_checks tells how often
 * MKL asked (tests read it).
 *
 * Built by scripts/setup.sh (python -m hvdscale.native build, cc -O2 -shared -fPIC) next
 * to epoll_yield.so; preloaded into the ranks of torch-ddp runs by hvdscale launch when
 * training.mkl_code_path is intel (default vendor: MKL's own choice). Horovod-TF runs
 * do not use MKL for their matrix products and ignore the setting. The file name has
 * "mkl" in it so that the run record's system.cpu_kernels names the override.
 */
unsigned long hvdscale_mkl_intel_checks = 0;

int mkl_serv_intel_cpu_true(void) {
    __atomic_fetch_add(&hvdscale_mkl_intel_checks, 1, __ATOMIC_RELAXED);
    return 1;
}
