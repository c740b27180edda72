/* A stand-in for libnvidia-ml.so.1 with two 80 GiB GPUs, for memsight.torch's NVML reader:
 * the calls it makes, the structs' real layouts, and one compute process on GPU 1 whose PID is
 * $FAKE_NVML_PID (the test passes its own host PID) using 5 GiB, plus one of another container. */
#include <stdlib.h>
#include <string.h>

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct {
  unsigned int pid;
  unsigned long long usedGpuMemory;
  unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;

static const unsigned long long GIB = 1ULL << 30;

int nvmlInit_v2(void) { return 0; }
const char* nvmlErrorString(int rc) { return rc ? "fake error" : "success"; }
int nvmlDeviceGetCount_v2(unsigned int* n) { *n = 2; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned int i, void** h) {
  if (i > 1) return 2; /* NVML_ERROR_INVALID_ARGUMENT */
  *h = (void*)(size_t)(i + 1);
  return 0;
}
static int idx(void* h) { return (int)(size_t)h - 1; }
int nvmlDeviceGetName(void* h, char* buf, unsigned int len) {
  strncpy(buf, idx(h) ? "Fake GPU one" : "Fake GPU zero", len);
  return 0;
}
int nvmlDeviceGetUUID(void* h, char* buf, unsigned int len) {
  strncpy(buf, idx(h) ? "GPU-11111111-aaaa" : "GPU-00000000-bbbb", len);
  return 0;
}
int nvmlDeviceGetMemoryInfo(void* h, nvmlMemory_t* m) {
  m->total = 80 * GIB;
  m->used = idx(h) ? 7 * GIB : 1 * GIB;
  m->free = m->total - m->used;
  return 0;
}
int nvmlDeviceGetUtilizationRates(void* h, nvmlUtilization_t* u) {
  u->gpu = idx(h) ? 42 : 0;
  u->memory = 0;
  return 0;
}
int nvmlDeviceGetComputeRunningProcesses_v3(void* h, unsigned int* n, nvmlProcessInfo_t* out) {
  unsigned int have = idx(h) ? 2 : 0;
  if (*n < have) { *n = have; return 7; /* NVML_ERROR_INSUFFICIENT_SIZE */ }
  *n = have;
  if (have) {
    const char* pid = getenv("FAKE_NVML_PID");
    out[0] = (nvmlProcessInfo_t){pid ? (unsigned)atoi(pid) : 1, 5 * GIB, 0, 0};
    out[1] = (nvmlProcessInfo_t){4000000000u, 2 * GIB, 0, 0};
  }
  return 0;
}
