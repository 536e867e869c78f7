/*
 * fake_libtpu.c: a stand-in for libtpu.so, used ONLY by
 * tools/op_coverage/regenerate.py to import torch_tpu on a machine that has
 * no TPU, so that its kernel registrations can be listed. It never executes
 * anything: every PJRT function pointer is NULL and is never called during
 * `import torch_tpu`.
 *
 * Why it is needed: at import, torch_tpu's C++ (tpu_dynamic_registration.cc)
 * does CHECK(RegisterDynamicPjrtPlugin("TPU", "TPU_LIBRARY_PATH")). That
 * dlopen()s $TPU_LIBRARY_PATH, dlsym()s GetPjrtApi, calls it, and aborts the
 * process (absl CHECK, before Python can catch it) if the file or symbol is
 * missing. The abort happens inside `import torch`, because torch_tpu is
 * autoloaded through the torch.backends entry point. The real libtpu wheel
 * (a dependency of torch-tpu) also works with no TPU, but this stub keeps
 * the run independent of libtpu's version and of anything libtpu does at
 * load time.
 *
 * Observed with torch-tpu 0.2.0: import only stores the returned pointer.
 * Even an all-zero table (struct_size 0) imports fine and registers the same
 * kernels. The header fields below are still set to plausible values, in
 * case a later release validates them.
 *
 * Build: gcc -shared -fPIC -O2 -o fake_libtpu.so fake_libtpu.c
 */
#include <stddef.h>

/* Layout from xla/pjrt/c/pjrt_c_api.h (C ABI, x86_64). */
typedef struct {
  size_t struct_size;    /* sizeof(PJRT_Api_Version) == 24 */
  void* extension_start; /* no extensions */
  int major_version;
  int minor_version;
} PJRT_Api_Version;

/* Number of function-pointer slots in PJRT_Api for C API 0.117, read from
 * the real libtpu 0.0.52 that pip installs with torch-tpu 0.2.0:
 * (struct_size 1144 - 40 header bytes) / 8 = 138. */
#define FAKE_PJRT_NUM_FUNCTIONS 138

typedef struct {
  size_t struct_size;    /* callers compare this against their compiled size */
  void* extension_start; /* NULL: no PJRT extensions (layouts, FFI, ...) */
  PJRT_Api_Version pjrt_api_version;
  void* functions[FAKE_PJRT_NUM_FUNCTIONS]; /* all NULL: nothing is callable */
} PJRT_Api;

static PJRT_Api fake_api = {
    /* The size the real libtpu reports (1144), so a struct-size check, if one
     * were done, would see a full table and not a truncated one. */
    .struct_size = sizeof(PJRT_Api),
    .extension_start = NULL,
    .pjrt_api_version =
        {
            .struct_size = sizeof(PJRT_Api_Version),
            .extension_start = NULL,
            /* The real libtpu 0.0.52 reports 0.117. Major 0 is the only major
             * PJRT has shipped. The minor is what a "requires C API version
             * 0.NN or higher" check (such strings are in libxla_base.so)
             * would compare against. */
            .major_version = 0,
            .minor_version = 117,
        },
    .functions = {0},
};

_Static_assert(sizeof(PJRT_Api_Version) == 24, "unexpected PJRT_Api_Version ABI");
_Static_assert(sizeof(PJRT_Api) == 1144, "unexpected PJRT_Api ABI");

/* The one symbol that PJRT plugin loading looks up with dlsym(). */
__attribute__((visibility("default"))) const PJRT_Api* GetPjrtApi(void) {
  return &fake_api;
}
