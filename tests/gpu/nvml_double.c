/* A test double of libnvidia-ml.so.1 that the real nvidia-ml-py (pynvml) loads.
 *
 * TESTS ONLY. Built by tests/gpu/nvml_double.py with the system C compiler into a
 * directory that the tests put on LD_LIBRARY_PATH; pynvml's CDLL("libnvidia-ml.so.1")
 * then finds it, so every line of supervisor/gpu/nvml.py runs against NVML's own ABI and
 * protocol. Built with -DOLD_DRIVER it lacks the _v3 process-list symbols, as a driver
 * older than pynvml does (pynvml 12.575+ then raises NVMLLibraryMismatchError).
 *
 * "The driver" is the JSON file named by $NVML_DOUBLE, read again on every call, so a
 * test changes what it says while a job runs. The schema is shared with the Python fake
 * (supervisor/gpu/fake.py's docstring lists the keys it reads too; a test runs one
 * document through both, tests/gpu/test_backends.py). Every key optional:
 *
 *   {"driver_version": "550.54.15", "nvml_version": "12.550.54.15",
 *    "init_delay_s": 1.0,                  no persistence mode: nvmlInit takes this long
 *    "init_error": "LIB_RM_VERSION_MISMATCH",   nvmlInit fails with it
 *    "init_error_in": "trainctl.supervisor",    ... only in processes whose command line
 *                                               holds this (absent: in every process)
 *    "init_log": "/path",                  one line appended per nvmlInit (tests count them)
 *    "fail": {"nvmlDeviceGetName": "GPU_IS_LOST"},      every device, this function
 *    "devices": [{
 *       "uuid": "GPU-...", "name": "NVIDIA H200", "minor": 0,
 *       "total": bytes, "used": bytes (driver-reserved, with no process),
 *       "utilization": 0, "persistence": 1, "ecc_uncorrected": 0,
 *       "lost": false,                     every call on it: GPU_IS_LOST (Xid 79)
 *       "recovery_action": 1,              NVML_FI_DEV_GET_GPU_RECOVERY_ACTION's value
 *                                          (absent: the field is NOT_SUPPORTED)
 *       "fail": {"nvmlDeviceGetComputeRunningProcesses_v3": "NOT_SUPPORTED"},
 *       "node": "/tmp/t/dev/nvidia0",      live processes with this file open hold the GPU:
 *                                          memory = their FAKE_GPU_MIB (default 1024) MiB
 *       "release_delay_s": 0,              a dead holder's memory is freed this late
 *       "stuck": false,                    a dead holder's memory is never freed
 *       "hide_processes": false,           memory counted, process list empty (container)
 *       "process_memory": true,            false: holders listed without their memory
 *       "processes": [{"pid": 7, "used": bytes | -1 (not available), "kind":
 *                      "compute" | "graphics" | "mps", "host": true}],
 *                                          listed while /proc/<pid> exists, or always with
 *                                          "host" (a host pid seen from a container)
 *       "xids": [79],                      Xid events, each delivered once per event set
 *       "mig": [{"uuid": "MIG-...", "total": bytes, "used": bytes, "gi": 1, "ci": 0,
 *                "node": ..., "processes": [...]}]   MIG mode on, these instances
 *    }]}
 *
 * A dead holder's death time is remembered in $NVML_DOUBLE.seen (one line per holder),
 * across processes, so memory lingers the same for the CLI and the supervisor. The
 * double knows a holder only from a call that saw it alive: a test of lingering memory
 * looks at the GPUs (`trainctl gpus`) while the job runs.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <pthread.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef int nvmlReturn_t;
enum {
  OK = 0, UNINITIALIZED = 1, INVALID_ARGUMENT = 2, NOT_SUPPORTED = 3, NO_PERMISSION = 4,
  NOT_FOUND = 6, INSUFFICIENT_SIZE = 7, DRIVER_NOT_LOADED = 9, TIMEOUT = 10,
  GPU_IS_LOST = 15, LIB_RM_VERSION_MISMATCH = 18, UNKNOWN = 999
};

/* ------------------------------------------------------------------ a small JSON reader */

typedef enum { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ } jtype;
typedef struct jval {
  jtype t;
  double num;
  char *str;           /* J_STR: the text; J_OBJ member: its key in key */
  char *key;
  struct jval *kids;   /* J_ARR / J_OBJ */
  int n;
} jval;

static const char *jp;

static void jskip(void) { while (*jp && isspace((unsigned char)*jp)) jp++; }

static int jparse(jval *v);

static char *jstring(void) {
  size_t cap = 16, len = 0;
  char *s = malloc(cap);
  jp++; /* opening quote */
  while (*jp && *jp != '"') {
    char c = *jp++;
    if (c == '\\' && *jp) {
      c = *jp++;
      if (c == 'n') c = '\n';
      else if (c == 't') c = '\t';
      else if (c == 'u') { c = '?'; for (int i = 0; i < 4 && *jp; i++) jp++; }
    }
    if (len + 2 > cap) s = realloc(s, cap *= 2);
    s[len++] = c;
  }
  if (*jp == '"') jp++;
  s[len] = 0;
  return s;
}

static int jlist(jval *v, char close, int keyed) {
  int cap = 4;
  v->kids = calloc(cap, sizeof(jval));
  jp++;
  for (;;) {
    jskip();
    if (*jp == close) { jp++; return 0; }
    if (v->n == cap) {
      v->kids = realloc(v->kids, (cap *= 2) * sizeof(jval));
      memset(v->kids + v->n, 0, (cap - v->n) * sizeof(jval));
    }
    jval *kid = &v->kids[v->n++];
    if (keyed) {
      if (*jp != '"') return -1;
      kid->key = jstring();
      jskip();
      if (*jp++ != ':') return -1;
    }
    if (jparse(kid)) return -1;
    jskip();
    if (*jp == ',') jp++;
    else if (*jp != close) return -1;
  }
}

static int jparse(jval *v) {
  jskip();
  if (*jp == '{') { v->t = J_OBJ; return jlist(v, '}', 1); }
  if (*jp == '[') { v->t = J_ARR; return jlist(v, ']', 0); }
  if (*jp == '"') { v->t = J_STR; v->str = jstring(); return 0; }
  if (!strncmp(jp, "true", 4)) { v->t = J_BOOL; v->num = 1; jp += 4; return 0; }
  if (!strncmp(jp, "false", 5)) { v->t = J_BOOL; jp += 5; return 0; }
  if (!strncmp(jp, "null", 4)) { v->t = J_NULL; jp += 4; return 0; }
  char *end;
  v->t = J_NUM;
  v->num = strtod(jp, &end);
  if (end == jp) return -1;
  jp = end;
  return 0;
}

static void jfree(jval *v) {
  for (int i = 0; i < v->n; i++) jfree(&v->kids[i]);
  free(v->kids); free(v->str); free(v->key);
  memset(v, 0, sizeof *v);
}

static jval *jget(jval *obj, const char *key) {
  if (!obj || obj->t != J_OBJ) return NULL;
  for (int i = 0; i < obj->n; i++)
    if (!strcmp(obj->kids[i].key, key)) return &obj->kids[i];
  return NULL;
}

static double jnum(jval *obj, const char *key, double dflt) {
  jval *v = jget(obj, key);
  return v && (v->t == J_NUM || v->t == J_BOOL) ? v->num : dflt;
}

static const char *jstr(jval *obj, const char *key, const char *dflt) {
  jval *v = jget(obj, key);
  return v && v->t == J_STR ? v->str : dflt;
}

static int jlen(jval *obj, const char *key) {
  jval *v = jget(obj, key);
  return v && v->t == J_ARR ? v->n : 0;
}

static jval *jat(jval *obj, const char *key, int i) {
  jval *v = jget(obj, key);
  return v && v->t == J_ARR && i < v->n ? &v->kids[i] : NULL;
}

/* ---------------------------------------------------------------------- the driver state */

static jval doc;           /* the JSON document, as of the last call */
static int doc_ok;
static int initialised;

/* Read $NVML_DOUBLE again (only when it changed: the event wait polls it). */
static void load(void) {
  static struct stat last;
  const char *path = getenv("NVML_DOUBLE");
  struct stat st;
  if (!path || stat(path, &st)) { jfree(&doc); doc_ok = 0; return; }
  if (doc_ok && st.st_mtim.tv_sec == last.st_mtim.tv_sec &&
      st.st_mtim.tv_nsec == last.st_mtim.tv_nsec && st.st_size == last.st_size && st.st_ino == last.st_ino)
    return;
  FILE *f = fopen(path, "r");
  if (!f) { doc_ok = 0; return; }
  char *text = calloc(1, st.st_size + 1);
  size_t got = fread(text, 1, st.st_size, f);
  fclose(f);
  text[got] = 0;
  jfree(&doc);
  jp = text;
  doc_ok = jparse(&doc) == 0 && doc.t == J_OBJ;
  free(text);
  last = st;
}

static int ndevices(void) { return jlen(&doc, "devices"); }

/* A handle points into this table, so it stays valid across reloads of the document. */
typedef struct { int dev; int mig; } handle_t; /* mig -1: the whole GPU */
static handle_t gpu_handles[64];
static handle_t mig_handles[64][8];

static jval *device_of(handle_t *h) {
  jval *d = jat(&doc, "devices", h->dev);
  return h->mig < 0 ? d : jat(d, "mig", h->mig);
}

static nvmlReturn_t err_named(const char *name) {
  static const struct { const char *name; nvmlReturn_t code; } table[] = {
    {"UNINITIALIZED", UNINITIALIZED}, {"NOT_SUPPORTED", NOT_SUPPORTED},
    {"NO_PERMISSION", NO_PERMISSION}, {"NOT_FOUND", NOT_FOUND},
    {"DRIVER_NOT_LOADED", DRIVER_NOT_LOADED}, {"TIMEOUT", TIMEOUT},
    {"GPU_IS_LOST", GPU_IS_LOST}, {"LIB_RM_VERSION_MISMATCH", LIB_RM_VERSION_MISMATCH},
    {"FUNCTION_NOT_FOUND", 13},
  };
  for (size_t i = 0; i < sizeof table / sizeof *table; i++)
    if (!strcmp(name, table[i].name)) return table[i].code;
  return UNKNOWN;
}

/* The failure injected for function fn on device h (or everywhere), or OK. */
static nvmlReturn_t injected(const char *fn, handle_t *h) {
  const char *e = jstr(jget(&doc, "fail"), fn, NULL);
  if (e) return err_named(e);
  if (!h) return OK;
  jval *gpu = jat(&doc, "devices", h->dev);
  if (jnum(gpu, "lost", 0)) return GPU_IS_LOST;
  e = jstr(jget(gpu, "fail"), fn, NULL);
  return e ? err_named(e) : OK;
}

/* NVML is thread-safe (the supervisor waits for Xid events in one thread while another
 * reads memory): one lock around every call, released at its return. */
static pthread_mutex_t big = PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP;
static void unlock_big(int *unused) { (void)unused; pthread_mutex_unlock(&big); }
#define LOCKED                 \
  pthread_mutex_lock(&big);    \
  int _held __attribute__((cleanup(unlock_big))) = 0; \
  (void)_held

#define ENTER(fn, h)                                   \
  LOCKED;                                              \
  do {                                                 \
    if (!initialised) return UNINITIALIZED;            \
    load();                                            \
    nvmlReturn_t _e = injected(fn, h);                 \
    if (_e != OK) return _e;                           \
  } while (0)

static int valid(void *h) {
  handle_t *p = h;
  int in_gpus = p >= gpu_handles && p < gpu_handles + 64;
  int in_migs = p >= &mig_handles[0][0] && p < &mig_handles[0][0] + 64 * 8;
  return (in_gpus || in_migs) && device_of(p) != NULL;
}

/* -------------------------------------------------------------- processes that hold a GPU */

typedef struct { unsigned pid; unsigned long long used, start; } proc_t; /* start: scan-time */

static int pid_alive(unsigned pid) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%u", pid);
  return access(path, F_OK) == 0;
}

/* /proc/PID/stat past the command's closing parenthesis (") S 1 ..."), or NULL. */
static char *stat_after_comm(unsigned pid, char *buf, size_t size) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%u/stat", pid);
  int fd = open(path, O_RDONLY);
  if (fd < 0) return NULL;
  ssize_t n = read(fd, buf, size - 1);
  close(fd);
  if (n <= 0) return NULL;
  buf[n] = 0;
  return strrchr(buf, ')');
}

static unsigned long long start_of(unsigned pid) {
  char buf[1024];
  char *p = stat_after_comm(pid, buf, sizeof buf);
  for (int field = 2; p && field < 22; field++) p = strchr(p + 1, ' ');
  return p ? strtoull(p + 1, NULL, 10) : 0;
}

static unsigned long long holder_bytes(unsigned pid) {
  char path[64], buf[65536];
  snprintf(path, sizeof path, "/proc/%u/environ", pid);
  int fd = open(path, O_RDONLY);
  if (fd < 0) return 1024ULL << 20;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  unsigned long long mib = 1024;
  for (ssize_t i = 0; n > 0 && i < n;) {
    if (!strncmp(buf + i, "FAKE_GPU_MIB=", 13)) mib = strtoull(buf + i + 13, NULL, 10);
    i += strnlen(buf + i, n - i) + 1;
  }
  return mib << 20;
}

/* Live processes with the device node `node` open. One walk of /proc/PID/fd serves
 * every node for 200 ms: a real driver answers from its own tables, and the double's
 * cost must not stand in for trainctl's in the benchmarks. */
typedef struct { char node[512]; unsigned pid; } fdhold_t;
static fdhold_t fd_cache[1024];
static int fd_cache_n;
static double fd_cache_at = -1;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int is_node(const char *target) {
  const char *dir = getenv("NVML_DOUBLE_DEV"); /* where the nodes are; all paths if unset */
  return !dir || !strncmp(target, dir, strlen(dir));
}

static void walk_fds(void) {
  fd_cache_n = 0;
  DIR *proc = opendir("/proc");
  struct dirent *e;
  while (proc && (e = readdir(proc)) && fd_cache_n < 1024) {
    if (!isdigit((unsigned char)e->d_name[0])) continue;
    char dir[300], link[4400], target[4096];
    snprintf(dir, sizeof dir, "/proc/%s/fd", e->d_name);
    DIR *fds = opendir(dir);
    struct dirent *f;
    while (fds && (f = readdir(fds)) && fd_cache_n < 1024) {
      snprintf(link, sizeof link, "%s/%s", dir, f->d_name);
      ssize_t len = readlink(link, target, sizeof target - 1);
      if (len <= 0 || len >= 512) continue;
      target[len] = 0;
      if (target[0] != '/' || !is_node(target)) continue;
      int dup = 0;
      unsigned pid = (unsigned)atoi(e->d_name);
      for (int i = 0; i < fd_cache_n; i++)
        if (fd_cache[i].pid == pid && !strcmp(fd_cache[i].node, target)) dup = 1;
      if (dup) continue;
      strcpy(fd_cache[fd_cache_n].node, target);
      fd_cache[fd_cache_n++].pid = pid;
    }
    if (fds) closedir(fds);
  }
  if (proc) closedir(proc);
  fd_cache_at = now_s();
}

/* A process holds its contexts until it exits: a zombie holds none. */
static int running(unsigned pid) {
  char buf[1024];
  char *p = stat_after_comm(pid, buf, sizeof buf);
  return p && p[1] == ' ' && p[2] != 'Z' && p[2] != 'X';
}

static int scan_holders(const char *node, proc_t *out, int max) {
  if (fd_cache_at < 0 || now_s() - fd_cache_at > 0.2) walk_fds();
  int n = 0;
  for (int i = 0; i < fd_cache_n && n < max; i++) {
    if (strcmp(fd_cache[i].node, node) || !running(fd_cache[i].pid)) continue;
    /* The start time is read once, here: read again later, a holder exiting in between
     * was counted live and as a ghost too (the Python fake's CI failure, the same race). */
    unsigned long long start = start_of(fd_cache[i].pid);
    if (!start) continue;
    out[n].pid = fd_cache[i].pid;
    out[n].start = start;
    out[n++].used = holder_bytes(fd_cache[i].pid);
  }
  return n;
}

/* The holders of `node`, live and dead-but-not-yet-released, kept in $NVML_DOUBLE.seen:
 * "node pid start bytes died_at" per line. Returns the live ones in `live`, and the
 * bytes still held by dead ones in *ghost_bytes. */
static int holders(jval *dev, proc_t *live, int max, unsigned long long *ghost_bytes) {
  const char *node = jstr(dev, "node", NULL);
  *ghost_bytes = 0;
  if (!node) return 0;
  int n = scan_holders(node, live, max);
  char seen[4200];
  snprintf(seen, sizeof seen, "%s.seen", getenv("NVML_DOUBLE"));
  int fd = open(seen, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return n;
  flock(fd, LOCK_EX);
  FILE *f = fdopen(fd, "r+");
  char *out = NULL;
  size_t out_len = 0;
  FILE *w = open_memstream(&out, &out_len);
  char path[4096];
  unsigned pid;
  unsigned long long start, bytes;
  double died, now = (double)time(NULL);
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  now = ts.tv_sec + ts.tv_nsec / 1e9;
  double delay = jnum(dev, "release_delay_s", 0);
  int stuck = (int)jnum(dev, "stuck", 0);
  while (fscanf(f, "%4095s %u %llu %llu %lf", path, &pid, &start, &bytes, &died) == 5) {
    if (strcmp(path, node)) { fprintf(w, "%s %u %llu %llu %.3f\n", path, pid, start, bytes, died); continue; }
    int is_live = 0;
    for (int i = 0; i < n; i++) {
      if (live[i].pid != pid || live[i].start != start) continue;
      is_live = 1;
      /* An exiting process's environ reads empty: its memory is what was seen before. */
      if (live[i].used < bytes) live[i].used = bytes;
    }
    if (is_live) continue; /* rewritten below */
    if (died == 0) died = now;
    if (stuck || now - died < delay) {
      *ghost_bytes += bytes;
      fprintf(w, "%s %u %llu %llu %.3f\n", path, pid, start, bytes, died);
    }
  }
  for (int i = 0; i < n; i++)
    fprintf(w, "%s %u %llu %llu 0\n", node, live[i].pid, live[i].start, live[i].used);
  fclose(w);
  rewind(f);
  if (ftruncate(fd, 0) == 0) fwrite(out, 1, out_len, f);
  free(out);
  fclose(f); /* closes fd, drops the lock */
  return n;
}

/* Every process NVML would list on `dev` of `kind`, and the memory in use. */
static int listed(jval *dev, const char *kind, proc_t *out, int max, unsigned long long *used) {
  proc_t live[256];
  unsigned long long ghosts;
  int n = 0, nlive = holders(dev, live, 256, &ghosts);
  *used = (unsigned long long)jnum(dev, "used", 0) + ghosts;
  int hide = (int)jnum(dev, "hide_processes", 0);
  int per = (int)jnum(dev, "process_memory", 1);
  for (int i = 0; i < nlive; i++) {
    *used += live[i].used;
    if (!strcmp(kind, "compute") && !hide && n < max) {
      out[n] = live[i];
      if (!per) out[n].used = ~0ULL; /* NVML_VALUE_NOT_AVAILABLE */
      n++;
    }
  }
  for (int i = 0; i < jlen(dev, "processes"); i++) {
    jval *p = jat(dev, "processes", i);
    unsigned pid = (unsigned)jnum(p, "pid", 0);
    double b = jnum(p, "used", 0);
    if (!jnum(p, "host", 0) && !pid_alive(pid)) continue;
    if (b > 0) *used += (unsigned long long)b;
    if (strcmp(jstr(p, "kind", "compute"), kind) || hide || n >= max) continue;
    out[n].pid = pid;
    out[n++].used = b < 0 ? ~0ULL : (unsigned long long)b; /* NVML_VALUE_NOT_AVAILABLE */
  }
  return n;
}

/* ------------------------------------------------------------------------ the NVML API */

static void copy_out(char *dst, unsigned len, const char *src) {
  if (len) { strncpy(dst, src, len - 1); dst[len - 1] = 0; }
}

/* Whether this process's command line (its arguments joined by spaces) holds ``text``. */
static int cmdline_has(const char *text) {
  char buf[4096];
  FILE *f = fopen("/proc/self/cmdline", "r");
  if (!f) return 0;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  for (size_t i = 0; i < n; i++)
    if (buf[i] == '\0') buf[i] = ' ';
  buf[n] = '\0';
  return strstr(buf, text) != NULL;
}

nvmlReturn_t nvmlInitWithFlags(unsigned flags) {
  (void)flags;
  LOCKED;
  load();
  if (!doc_ok) return DRIVER_NOT_LOADED;
  const char *log = jstr(&doc, "init_log", NULL);
  if (log) {
    FILE *f = fopen(log, "a");
    if (f) { fprintf(f, "init %d %s\n", (int)getpid(), initialised ? "again" : "first"); fclose(f); }
  }
  /* Without persistence mode the first init of a process loads the driver state; a
   * process that holds NVML open already only counts one more reference. */
  double delay = jnum(&doc, "init_delay_s", 0);
  if (delay > 0 && !initialised) usleep((useconds_t)(delay * 1e6));
  const char *e = jstr(&doc, "init_error", NULL);
  const char *in = jstr(&doc, "init_error_in", NULL);
  if (e && (!in || cmdline_has(in))) return err_named(e);
  initialised++;
  return OK;
}

nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void) {
  LOCKED;
  if (!initialised) return UNINITIALIZED;
  initialised--;
  return OK;
}

const char *nvmlErrorString(nvmlReturn_t r) {
  switch (r) {
    case OK: return "Success";
    case UNINITIALIZED: return "Uninitialized";
    case INVALID_ARGUMENT: return "Invalid Argument";
    case NOT_SUPPORTED: return "Not Supported";
    case NO_PERMISSION: return "Insufficient Permissions";
    case NOT_FOUND: return "Not Found";
    case INSUFFICIENT_SIZE: return "Insufficient Size";
    case DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case TIMEOUT: return "Timeout";
    case GPU_IS_LOST: return "GPU is lost";
    case LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch.";
    default: return "Unknown Error";
  }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *v, unsigned len) {
  ENTER("nvmlSystemGetDriverVersion", NULL);
  copy_out(v, len, jstr(&doc, "driver_version", "550.54.15"));
  return OK;
}

nvmlReturn_t nvmlSystemGetNVMLVersion(char *v, unsigned len) {
  ENTER("nvmlSystemGetNVMLVersion", NULL);
  copy_out(v, len, jstr(&doc, "nvml_version", "12.550.54.15"));
  return OK;
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned *count) {
  ENTER("nvmlDeviceGetCount_v2", NULL);
  *count = (unsigned)ndevices();
  return OK;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned i, handle_t **h) {
  ENTER("nvmlDeviceGetHandleByIndex_v2", NULL);
  if (i >= (unsigned)ndevices() || i >= 64) return INVALID_ARGUMENT;
  gpu_handles[i] = (handle_t){(int)i, -1};
  nvmlReturn_t e = injected("nvmlDeviceGetHandleByIndex_v2", &gpu_handles[i]);
  if (e != OK && e != GPU_IS_LOST) return e; /* a lost GPU still has a handle */
  *h = &gpu_handles[i];
  return OK;
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, handle_t **h) {
  ENTER("nvmlDeviceGetHandleByUUID", NULL);
  for (int i = 0; i < ndevices() && i < 64; i++) {
    if (!strcmp(jstr(jat(&doc, "devices", i), "uuid", ""), uuid)) {
      gpu_handles[i] = (handle_t){i, -1};
      *h = &gpu_handles[i];
      return OK;
    }
  }
  return NOT_FOUND;
}

#define DEVICE(fn)                       \
  ENTER(fn, NULL);                       \
  if (!valid(h)) return INVALID_ARGUMENT; \
  do {                                   \
    nvmlReturn_t _d = injected(fn, h);   \
    if (_d != OK) return _d;             \
  } while (0);                           \
  jval *dev = device_of(h)

nvmlReturn_t nvmlDeviceGetUUID(handle_t *h, char *v, unsigned len) {
  DEVICE("nvmlDeviceGetUUID");
  copy_out(v, len, jstr(dev, "uuid", "GPU-00000000-0000-0000-0000-000000000000"));
  return OK;
}

nvmlReturn_t nvmlDeviceGetName(handle_t *h, char *v, unsigned len) {
  DEVICE("nvmlDeviceGetName");
  jval *gpu = jat(&doc, "devices", h->dev);
  copy_out(v, len, jstr(dev, "name", jstr(gpu, "name", "NVIDIA H200")));
  return OK;
}

nvmlReturn_t nvmlDeviceGetIndex(handle_t *h, unsigned *index) {
  DEVICE("nvmlDeviceGetIndex");
  (void)dev;
  *index = (unsigned)h->dev;
  return OK;
}

nvmlReturn_t nvmlDeviceGetMinorNumber(handle_t *h, unsigned *minor) {
  DEVICE("nvmlDeviceGetMinorNumber");
  if (h->mig >= 0) return NOT_SUPPORTED;
  *minor = (unsigned)jnum(dev, "minor", h->dev);
  return OK;
}

nvmlReturn_t nvmlDeviceGetPersistenceMode(handle_t *h, unsigned *mode) {
  DEVICE("nvmlDeviceGetPersistenceMode");
  *mode = (unsigned)jnum(dev, "persistence", 1);
  return OK;
}

typedef struct { unsigned long long total, free, used; } memory_t;
typedef struct { unsigned version; unsigned long long total, reserved, free, used; } memory_v2_t;

static unsigned long long used_now(jval *dev) {
  proc_t p[256];
  unsigned long long used = 0;
  listed(dev, "compute", p, 256, &used);
  return used;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(handle_t *h, memory_t *m) {
  DEVICE("nvmlDeviceGetMemoryInfo");
  unsigned long long total = (unsigned long long)jnum(dev, "total", 150754820096.0);
  m->total = total;
  m->used = used_now(dev);
  m->free = m->used < total ? total - m->used : 0;
  return OK;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(handle_t *h, memory_v2_t *m) {
  DEVICE("nvmlDeviceGetMemoryInfo_v2");
  unsigned long long total = (unsigned long long)jnum(dev, "total", 150754820096.0);
  m->total = total;
  m->reserved = 0;
  m->used = used_now(dev);
  m->free = m->used < total ? total - m->used : 0;
  return OK;
}

typedef struct { unsigned gpu, memory; } utilization_t;

nvmlReturn_t nvmlDeviceGetUtilizationRates(handle_t *h, utilization_t *u) {
  DEVICE("nvmlDeviceGetUtilizationRates");
  if (h->mig >= 0) return NOT_SUPPORTED; /* as on real MIG instances */
  u->gpu = (unsigned)jnum(dev, "utilization", 0);
  u->memory = 0;
  return OK;
}

nvmlReturn_t nvmlDeviceGetTotalEccErrors(handle_t *h, int type, int counter, unsigned long long *n) {
  DEVICE("nvmlDeviceGetTotalEccErrors");
  (void)type;
  *n = counter == 0 ? (unsigned long long)jnum(dev, "ecc_uncorrected", 0) : 0;
  return OK;
}

/* nvmlDeviceGetFieldValues: the one field trainctl asks for is the driver's recovery
 * action (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = 230), from the device's
 * "recovery_action"; a device without that key, and every other field, answers
 * NOT_SUPPORTED in the value's own status, as a driver older than the field does. */
typedef struct {
  unsigned field_id, scope_id;
  long long timestamp, latency_us;
  unsigned value_type, ret;
  union { double d; unsigned ui; unsigned long ul; unsigned long long ull; } value;
} field_value_t;

nvmlReturn_t nvmlDeviceGetFieldValues(handle_t *h, int count, field_value_t *values) {
  DEVICE("nvmlDeviceGetFieldValues");
  for (int i = 0; i < count; i++) {
    field_value_t *v = &values[i];
    double action = jnum(dev, "recovery_action", -1);
    v->timestamp = (long long)time(NULL) * 1000000;
    v->latency_us = 0;
    if (v->field_id != 230 || action < 0 || h->mig >= 0) {
      v->ret = NOT_SUPPORTED;
      continue;
    }
    v->value_type = 1; /* NVML_VALUE_TYPE_UNSIGNED_INT */
    v->value.ull = 0;
    v->value.ui = (unsigned)action;
    v->ret = OK;
  }
  return OK;
}

/* NVML's protocol: with *count too small (or infos NULL) it sets *count and returns
 * INSUFFICIENT_SIZE when processes exist; SUCCESS with *count = 0 only when none run. */
typedef struct { unsigned pid; unsigned long long used; unsigned gi, ci; } info_v2_t;
typedef struct { unsigned pid; unsigned long long used; } info_v1_t;

static nvmlReturn_t procs_v2(handle_t *h, const char *fn, const char *kind, unsigned *count,
                             info_v2_t *infos) {
  DEVICE(fn);
  proc_t p[256];
  unsigned long long used;
  int n = listed(dev, kind, p, 256, &used);
  if (!infos || *count < (unsigned)n) {
    *count = (unsigned)n;
    return n ? INSUFFICIENT_SIZE : OK;
  }
  for (int i = 0; i < n; i++) {
    infos[i].pid = p[i].pid;
    infos[i].used = p[i].used;
    infos[i].gi = h->mig >= 0 ? (unsigned)jnum(dev, "gi", h->mig + 1) : 0xFFFFFFFF;
    infos[i].ci = h->mig >= 0 ? (unsigned)jnum(dev, "ci", 0) : 0xFFFFFFFF;
  }
  *count = (unsigned)n;
  return OK;
}

/* One exported process-list call: its injected failures go by its own name. */
#define PROCESS_LIST(fn, kind) \
  nvmlReturn_t fn(handle_t *h, unsigned *c, info_v2_t *i) { return procs_v2(h, #fn, kind, c, i); }

#ifndef OLD_DRIVER
PROCESS_LIST(nvmlDeviceGetComputeRunningProcesses_v3, "compute")
PROCESS_LIST(nvmlDeviceGetGraphicsRunningProcesses_v3, "graphics")
PROCESS_LIST(nvmlDeviceGetMPSComputeRunningProcesses_v3, "mps")
#endif
PROCESS_LIST(nvmlDeviceGetComputeRunningProcesses_v2, "compute")
PROCESS_LIST(nvmlDeviceGetGraphicsRunningProcesses_v2, "graphics")
PROCESS_LIST(nvmlDeviceGetMPSComputeRunningProcesses_v2, "mps")

/* ---------------------------------------------------------------------------------- MIG */

nvmlReturn_t nvmlDeviceGetMigMode(handle_t *h, unsigned *current, unsigned *pending) {
  DEVICE("nvmlDeviceGetMigMode");
  if (h->mig >= 0 || !jget(dev, "mig")) return NOT_SUPPORTED;
  *current = *pending = 1;
  return OK;
}

nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(handle_t *h, unsigned *count) {
  DEVICE("nvmlDeviceGetMaxMigDeviceCount");
  if (h->mig >= 0 || !jget(dev, "mig")) return NOT_SUPPORTED;
  *count = 7;
  return OK;
}

nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(handle_t *h, unsigned i, handle_t **out) {
  DEVICE("nvmlDeviceGetMigDeviceHandleByIndex");
  if (h->mig >= 0) return INVALID_ARGUMENT;
  if (i >= 8 || (int)i >= jlen(dev, "mig")) return NOT_FOUND;
  mig_handles[h->dev][i] = (handle_t){h->dev, (int)i};
  *out = &mig_handles[h->dev][i];
  return OK;
}

nvmlReturn_t nvmlDeviceIsMigDeviceHandle(handle_t *h, unsigned *is_mig) {
  DEVICE("nvmlDeviceIsMigDeviceHandle");
  (void)dev;
  *is_mig = h->mig >= 0;
  return OK;
}

nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle_t *h, handle_t **out) {
  DEVICE("nvmlDeviceGetDeviceHandleFromMigDeviceHandle");
  (void)dev;
  if (h->mig < 0) return INVALID_ARGUMENT;
  *out = &gpu_handles[h->dev];
  return OK;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceId(handle_t *h, unsigned *id) {
  DEVICE("nvmlDeviceGetGpuInstanceId");
  if (h->mig < 0) return INVALID_ARGUMENT;
  *id = (unsigned)jnum(dev, "gi", h->mig + 1);
  return OK;
}

nvmlReturn_t nvmlDeviceGetComputeInstanceId(handle_t *h, unsigned *id) {
  DEVICE("nvmlDeviceGetComputeInstanceId");
  if (h->mig < 0) return INVALID_ARGUMENT;
  *id = (unsigned)jnum(dev, "ci", 0);
  return OK;
}

/* ------------------------------------------------------------------------------- events */

#define XID_CRITICAL 0x8ULL
typedef struct {
  unsigned long long types[64]; /* registered event types per GPU */
  int delivered[64];            /* Xids of each GPU's list delivered so far */
} event_set_t;
typedef struct {
  handle_t *device;
  unsigned long long type, data;
  unsigned gi, ci;
} event_data_t;

nvmlReturn_t nvmlEventSetCreate(event_set_t **set) {
  ENTER("nvmlEventSetCreate", NULL);
  *set = calloc(1, sizeof **set);
  return OK;
}

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(handle_t *h, unsigned long long *types) {
  DEVICE("nvmlDeviceGetSupportedEventTypes");
  (void)dev;
  *types = XID_CRITICAL | 0x1 | 0x2 | 0x4;
  return OK;
}

nvmlReturn_t nvmlDeviceRegisterEvents(handle_t *h, unsigned long long types, event_set_t *set) {
  DEVICE("nvmlDeviceRegisterEvents");
  (void)dev;
  if (!set || h->mig >= 0) return INVALID_ARGUMENT;
  set->types[h->dev] |= types;
  /* events from before the registration are not delivered */
  set->delivered[h->dev] = jlen(dev, "xids");
  return OK;
}

static nvmlReturn_t next_event(event_set_t *set, event_data_t *data) {
  for (int i = 0; i < ndevices() && i < 64; i++) {
    jval *dev = jat(&doc, "devices", i);
    if (!(set->types[i] & XID_CRITICAL) || set->delivered[i] >= jlen(dev, "xids")) continue;
    jval *x = jat(dev, "xids", set->delivered[i]++);
    data->device = &gpu_handles[i];
    gpu_handles[i] = (handle_t){i, -1};
    data->type = XID_CRITICAL;
    data->data = x && x->t == J_NUM ? (unsigned long long)x->num : 0;
    data->gi = data->ci = 0xFFFFFFFF;
    return OK;
  }
  return TIMEOUT;
}

static nvmlReturn_t poll_event(event_set_t *set, event_data_t *data) {
  ENTER("nvmlEventSetWait_v2", NULL);
  return next_event(set, data);
}

nvmlReturn_t nvmlEventSetWait_v2(event_set_t *set, event_data_t *data, unsigned timeout_ms) {
  if (!set) return INVALID_ARGUMENT;
  /* The real call sleeps in the kernel; this one looks at the document every 200 ms
   * (one stat while it is unchanged), and holds the lock only while it looks. */
  for (unsigned waited = 0;; waited += 200) {
    nvmlReturn_t r = poll_event(set, data);
    if (r != TIMEOUT) return r;
    if (waited >= timeout_ms) return TIMEOUT;
    usleep(200 * 1000);
  }
}

nvmlReturn_t nvmlEventSetWait(event_set_t *set, event_data_t *data, unsigned timeout_ms) {
  return nvmlEventSetWait_v2(set, data, timeout_ms);
}

nvmlReturn_t nvmlEventSetFree(event_set_t *set) {
  free(set);
  return OK;
}
