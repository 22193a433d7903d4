/* Build-time stand-in for the CUDA driver (libcuda.so.1), loaded only on machines without one, so
 * that TVM's libtvm_runtime_cuda.so (which registers the CUDA module factory that tvm.compile needs)
 * can be loaded to *build* CUDA kernels. Every entry point reports CUDA_ERROR_NO_DEVICE (100).
 * These are the driver symbols libtvm_runtime_cuda.so of apache-tvm 0.27 imports. */
static const char *kNoDevice = "mxgemm build-time libcuda stub: no CUDA device";
int cuGetErrorName(int e, const char **s) { (void)e; *s = kNoDevice; return 0; }
int cuGetErrorString(int e, const char **s) { (void)e; *s = kNoDevice; return 0; }
int cuDeviceGetName(char *n, int len, int d) { (void)n; (void)len; (void)d; return 100; }
int cuFuncSetAttribute(void *f, int a, int v) { (void)f; (void)a; (void)v; return 100; }
int cuLaunchKernelEx(const void *c, void *f, void **p, void **e) { (void)c; (void)f; (void)p; (void)e; return 100; }
int cuModuleGetFunction(void **f, void *m, const char *n) { (void)f; (void)m; (void)n; return 100; }
int cuModuleLoadData(void **m, const void *img) { (void)m; (void)img; return 100; }
int cuModuleUnload(void *m) { (void)m; return 100; }
int cuTensorMapEncodeTiled(void) { return 100; }
