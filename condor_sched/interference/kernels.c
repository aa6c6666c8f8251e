/* cosched-kernels: the small programs of the interference suite (paper 004's measurement).
 *
 * usage: cosched-kernels KERNEL SIZE_KIB WARMUP_S WINDOW_S THINK_MS
 *
 * Builds its working set, prints "ready", waits for one line on stdin (the harness starts
 * both programs of a pair at once), then repeats small units of work until
 * WARMUP_S + WINDOW_S has passed. THINK_MS > 0 makes it interactive: it sleeps THINK_MS after
 * every burst of about 10 ms of dedicated work (paper 004, Listing 1), and only its execution
 * periods count as busy time. It prints one JSON line: the units finished inside the window,
 * the span between the first and last of them, the busy time inside that span, and what the
 * node's software signals saw over the whole run after "go" (getrusage, /proc/self/schedstat,
 * perf software events, and hardware events where the node has a PMU).
 *
 * Built with the node's C compiler (gcc -O2); no library beyond libc and libm.
 */
#define _GNU_SOURCE
#include <linux/perf_event.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static uint64_t rng_state = 88172645463325252ull;
static inline uint64_t xorshift(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static volatile double sink_d;
static volatile uint64_t sink_u;
static size_t words;        /* working set in 8-byte words */
static size_t mask;         /* words rounded down to a power of two, minus one */
static double *A, *B, *C;
static uint64_t *P;
static uint32_t *cols;
static unsigned char *bytes;
static size_t cursor;

static void *must_alloc(size_t n) {
    void *p = aligned_alloc(64, (n + 63) / 64 * 64);
    if (!p) { fprintf(stderr, "cosched-kernels: out of memory (%zu bytes)\n", n); exit(2); }
    memset(p, 0, n);
    return p;
}

static void fill_random_doubles(double *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = (double)(xorshift() % 1000) * 1e-3;
}

/* compute-bound: eight dependent multiply-add chains in registers */
static void unit_fma(void) {
    double x0 = 1, x1 = 2, x2 = 3, x3 = 4, x4 = 5, x5 = 6, x6 = 7, x7 = 8;
    const double a = 0.999999, b = 1e-7;
    for (int i = 0; i < 400000; i++) {
        x0 = x0 * a + b; x1 = x1 * a + b; x2 = x2 * a + b; x3 = x3 * a + b;
        x4 = x4 * a + b; x5 = x5 * a + b; x6 = x6 * a + b; x7 = x7 * a + b;
    }
    sink_d = x0 + x1 + x2 + x3 + x4 + x5 + x6 + x7;
}

/* integer-bound: a dependent multiply-xorshift hash chain */
static void unit_intmix(void) {
    uint64_t h = sink_u | 1;
    for (int i = 0; i < 1000000; i++) {
        h ^= h >> 31; h *= 0x9E3779B97F4A7C15ull; h ^= h << 7;
    }
    sink_u = h;
}

/* dense matrix multiply (the paper's "mm"), i-k-j order on n x n doubles */
static size_t mm_n;
static void unit_mm(void) {
    size_t n = mm_n;
    for (size_t i = 0; i < n; i++)
        for (size_t k = 0; k < n; k++) {
            double a = A[i * n + k];
            for (size_t j = 0; j < n; j++) C[i * n + j] += a * B[k * n + j];
        }
    sink_d = C[n + 1];
}

/* sequential sums over a small array: L1/L2 resident */
static void unit_sweep(void) {
    double s = 0;
    size_t passes = (size_t)(2000000 / (words + 1)) + 1;
    for (size_t p = 0; p < passes; p++)
        for (size_t i = 0; i < words; i++) s += A[i] * 1.0000001;
    sink_d = s;
}

/* independent random reads over the working set (cache-resident while it fits) */
static void unit_random_read(void) {
    uint64_t s = 0;
    for (int i = 0; i < 300000; i++) s += P[xorshift() & mask];
    sink_u = s;
}

/* dependent pointer chasing over a random cycle: memory latency */
static void unit_chase(void) {
    uint64_t p = sink_u & mask;
    for (int i = 0; i < 60000; i++) p = P[p];
    sink_u = p;
}

/* STREAM triad a = b + s*c over three arrays, one chunk per unit: memory bandwidth */
static void unit_stream(void) {
    const size_t chunk = words < 65536 ? words : 65536;
    for (size_t r = 0; r < 4; r++) {
        if (cursor + chunk > words) cursor = 0;
        for (size_t i = cursor; i < cursor + chunk; i++) A[i] = B[i] + 3.0 * C[i];
        cursor += chunk;
    }
    sink_d = A[cursor - 1];
}

/* memcpy through a large buffer, one chunk per unit */
static void unit_copy(void) {
    const size_t chunk = words / 2 < 262144 ? words / 2 : 262144;   /* words */
    if (cursor + chunk > words / 2) cursor = 0;
    memcpy(A + words / 2 + cursor, A + cursor, chunk * sizeof(double));
    cursor += chunk;
    sink_d = A[cursor];
}

/* unpredictable multi-way branches over random bytes */
static void unit_branchy(void) {
    uint64_t s = sink_u;
    for (size_t i = 0; i < 200000; i++) {
        switch (bytes[(cursor + i) & 65535] & 7) {
        case 0: s += i; break;
        case 1: s ^= s >> 3; break;
        case 2: s *= 3; break;
        case 3: s -= i * 7; break;
        case 4: s = (s << 1) | (s >> 63); break;
        case 5: s += 0x5555; break;
        case 6: s ^= i; break;
        default: s = ~s; break;
        }
    }
    cursor += 4099;
    sink_u = s;
}

/* malloc/free of mixed sizes (some above the mmap threshold), each touched */
static void *pool[256];
static void unit_alloc(void) {
    for (int i = 0; i < 800; i++) {
        size_t k = xorshift() & 255;
        free(pool[k]);
        size_t size = (xorshift() & 15) == 0 ? 262144 : 16 + (xorshift() & 16383);
        unsigned char *p = malloc(size);
        if (!p) exit(2);
        for (size_t off = 0; off < size; off += 4096) p[off] = (unsigned char)off;
        pool[k] = p;
    }
}

/* map, touch every page of, and unmap 2 MiB: page faults and kernel time */
static void unit_pagefault(void) {
    const size_t size = 2u << 20;
    unsigned char *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) exit(2);
    for (size_t off = 0; off < size; off += 4096) p[off] = 1;
    munmap(p, size);
}

/* sort 32 Ki random integers */
static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}
static void unit_sort(void) {
    for (size_t i = 0; i < 32768; i++) cols[i] = (uint32_t)xorshift();
    qsort(cols, 32768, sizeof(uint32_t), cmp_u32);
    sink_u = cols[100];
}

/* 5-point Jacobi stencil over an n x n grid, 32 rows per unit (multigrid-like) */
static size_t grid_n;
static void unit_stencil(void) {
    size_t n = grid_n;
    for (size_t r = 0; r < 32; r++) {
        if (cursor < 1 || cursor >= n - 1) cursor = 1;
        size_t i = cursor++;
        for (size_t j = 1; j < n - 1; j++)
            B[i * n + j] = 0.25 * (A[(i - 1) * n + j] + A[(i + 1) * n + j] + A[i * n + j - 1] + A[i * n + j + 1]);
    }
    if (cursor >= n - 1) { double *t = A; A = B; B = t; }
    sink_d = B[n + 1];
}

/* sparse matrix-vector product, 8 random columns per row (conjugate-gradient-like) */
static size_t spmv_rows;
static void unit_spmv(void) {
    for (size_t r = 0; r < 16384; r++) {
        size_t row = (cursor + r) % spmv_rows;
        double s = 0;
        for (int k = 0; k < 8; k++) s += A[row * 8 + k] * B[cols[row * 8 + k]];
        C[row] = s;
    }
    cursor = (cursor + 16384) % spmv_rows;
    sink_d = C[cursor];
}

/* alternating phases: a compute unit, then a streaming unit */
static int phase;
static void unit_mixed(void) {
    if ((phase++ & 1) == 0) unit_fma(); else unit_stream();
}

typedef void (*unit_fn)(void);

static unit_fn setup(const char *kernel, size_t kib) {
    size_t bytes_ws = kib * 1024;
    words = bytes_ws / 8 > 16 ? bytes_ws / 8 : 16;
    mask = 1;
    while (mask * 2 <= words) mask *= 2;
    mask -= 1;
    if (!strcmp(kernel, "fma")) return unit_fma;
    if (!strcmp(kernel, "intmix")) return unit_intmix;
    if (!strcmp(kernel, "mm")) {
        mm_n = (size_t)sqrt((double)words / 3.0);
        A = must_alloc(mm_n * mm_n * 8); B = must_alloc(mm_n * mm_n * 8); C = must_alloc(mm_n * mm_n * 8);
        fill_random_doubles(A, mm_n * mm_n); fill_random_doubles(B, mm_n * mm_n);
        return unit_mm;
    }
    if (!strcmp(kernel, "sweep")) { A = must_alloc(words * 8); fill_random_doubles(A, words); return unit_sweep; }
    if (!strcmp(kernel, "random-read")) {
        P = must_alloc((mask + 1) * 8);
        for (size_t i = 0; i <= mask; i++) P[i] = xorshift();
        return unit_random_read;
    }
    if (!strcmp(kernel, "chase")) {   /* Sattolo's shuffle: one cycle through every word */
        P = must_alloc((mask + 1) * 8);
        for (size_t i = 0; i <= mask; i++) P[i] = i;
        for (size_t i = mask; i > 0; i--) {
            size_t j = xorshift() % i;
            uint64_t t = P[i]; P[i] = P[j]; P[j] = t;
        }
        return unit_chase;
    }
    if (!strcmp(kernel, "stream")) {
        words /= 3;
        A = must_alloc(words * 8); B = must_alloc(words * 8); C = must_alloc(words * 8);
        fill_random_doubles(B, words); fill_random_doubles(C, words);
        return unit_stream;
    }
    if (!strcmp(kernel, "copy")) { A = must_alloc(words * 8); fill_random_doubles(A, words); return unit_copy; }
    if (!strcmp(kernel, "branchy")) {
        bytes = must_alloc(65536);
        for (size_t i = 0; i < 65536; i++) bytes[i] = (unsigned char)xorshift();
        return unit_branchy;
    }
    if (!strcmp(kernel, "alloc")) return unit_alloc;
    if (!strcmp(kernel, "pagefault")) return unit_pagefault;
    if (!strcmp(kernel, "sort")) { cols = must_alloc(32768 * 4); return unit_sort; }
    if (!strcmp(kernel, "stencil")) {
        grid_n = (size_t)sqrt((double)words / 2.0);
        A = must_alloc(grid_n * grid_n * 8); B = must_alloc(grid_n * grid_n * 8);
        fill_random_doubles(A, grid_n * grid_n);
        return unit_stencil;
    }
    if (!strcmp(kernel, "spmv")) {   /* 8 values + 8 column indices per row, a vector of rows */
        spmv_rows = words / 13 > 16384 ? words / 13 : 16384;
        A = must_alloc(spmv_rows * 8 * 8); B = must_alloc(spmv_rows * 8); C = must_alloc(spmv_rows * 8);
        cols = must_alloc(spmv_rows * 8 * 4);
        fill_random_doubles(A, spmv_rows * 8); fill_random_doubles(B, spmv_rows);
        for (size_t i = 0; i < spmv_rows * 8; i++) cols[i] = (uint32_t)(xorshift() % spmv_rows);
        return unit_spmv;
    }
    if (!strcmp(kernel, "mixed")) {
        words /= 3;
        A = must_alloc(words * 8); B = must_alloc(words * 8); C = must_alloc(words * 8);
        fill_random_doubles(B, words); fill_random_doubles(C, words);
        return unit_mixed;
    }
    return NULL;
}

/* Software (and, where present, hardware) perf events of this process, counted from "go". */
struct counter { const char *name; uint32_t type; uint64_t config; int fd; };
static struct counter counters[] = {
    {"task_clock_ns", PERF_TYPE_SOFTWARE, PERF_COUNT_SW_TASK_CLOCK, -1},
    {"context_switches", PERF_TYPE_SOFTWARE, PERF_COUNT_SW_CONTEXT_SWITCHES, -1},
    {"cpu_migrations", PERF_TYPE_SOFTWARE, PERF_COUNT_SW_CPU_MIGRATIONS, -1},
    {"page_faults", PERF_TYPE_SOFTWARE, PERF_COUNT_SW_PAGE_FAULTS, -1},
    {"minor_faults", PERF_TYPE_SOFTWARE, PERF_COUNT_SW_PAGE_FAULTS_MIN, -1},
    {"major_faults", PERF_TYPE_SOFTWARE, PERF_COUNT_SW_PAGE_FAULTS_MAJ, -1},
    {"hw_cycles", PERF_TYPE_HARDWARE, PERF_COUNT_HW_CPU_CYCLES, -1},
    {"hw_instructions", PERF_TYPE_HARDWARE, PERF_COUNT_HW_INSTRUCTIONS, -1},
    {"hw_cache_misses", PERF_TYPE_HARDWARE, PERF_COUNT_HW_CACHE_MISSES, -1},
    {"hw_branch_misses", PERF_TYPE_HARDWARE, PERF_COUNT_HW_BRANCH_MISSES, -1},
};
#define N_COUNTERS (sizeof counters / sizeof counters[0])

static void open_counters(void) {
    for (size_t i = 0; i < N_COUNTERS; i++) {
        struct perf_event_attr attr;
        memset(&attr, 0, sizeof attr);
        attr.size = sizeof attr;
        attr.type = counters[i].type;
        attr.config = counters[i].config;
        attr.disabled = 1;
        attr.exclude_hv = 1;
        counters[i].fd = (int)syscall(SYS_perf_event_open, &attr, 0, -1, -1, 0);
    }
}

static void enable_counters(void) {
    for (size_t i = 0; i < N_COUNTERS; i++)
        if (counters[i].fd >= 0) ioctl(counters[i].fd, PERF_EVENT_IOC_ENABLE, 0);
}

static int read_schedstat(unsigned long long v[3]) {
    FILE *f = fopen("/proc/self/schedstat", "r");
    if (!f) return 0;
    int ok = fscanf(f, "%llu %llu %llu", &v[0], &v[1], &v[2]) == 3;
    fclose(f);
    return ok;
}

/* peak resident set of this program (ru_maxrss would carry the forking parent's peak) */
static long read_peak_rss_kib(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kib = -1;
    if (!f) return -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %ld kB", &kib) == 1) break;
    fclose(f);
    return kib;
}

static double tv(struct timeval t) { return (double)t.tv_sec + (double)t.tv_usec * 1e-6; }

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: cosched-kernels KERNEL SIZE_KIB WARMUP_S WINDOW_S THINK_MS\n");
        return 2;
    }
    const char *kernel = argv[1];
    size_t kib = (size_t)strtoull(argv[2], NULL, 10);
    double warmup = atof(argv[3]), window = atof(argv[4]), think_ms = atof(argv[5]);
    if (kib < 1 || kib > (64u << 20) || !(warmup >= 0) || !(window > 0) || !(think_ms >= 0)) {
        fprintf(stderr, "cosched-kernels: bad arguments\n");
        return 2;
    }
    unit_fn unit = setup(kernel, kib);
    if (!unit) { fprintf(stderr, "cosched-kernels: unknown kernel %s\n", kernel); return 2; }
    unit();                       /* first touch of the working set before the clock starts */
    open_counters();
    printf("ready\n");
    fflush(stdout);
    char line[16];
    if (!fgets(line, sizeof line, stdin)) return 3;

    struct rusage ru0, ru1;
    unsigned long long ss0[3] = {0}, ss1[3] = {0};
    int have_ss = read_schedstat(ss0);
    getrusage(RUSAGE_SELF, &ru0);
    enable_counters();
    double go = now(), start = go + warmup, end = start + window;
    double first = -1, last = -1, busy = 0, burst_work = 0;
    long units = 0;
    double unit_cost = -1;       /* dedicated cost of one unit, learned during warm-up */
    for (;;) {
        double t0 = now();
        unit();
        double t1 = now();
        if (t1 >= end) break;
        if (t1 < start) {
            unit_cost = unit_cost < 0 ? t1 - t0 : fmin(unit_cost, t1 - t0);
        } else if (first < 0) {
            first = t1;
        } else {
            units++;
            last = t1;
            busy += t1 - t0;
        }
        if (think_ms > 0 && unit_cost > 0) {
            burst_work += unit_cost;
            if (burst_work >= 0.010) {        /* a 10 ms burst of dedicated work, then think */
                burst_work = 0;
                struct timespec pause = {(time_t)(think_ms / 1000), (long)(fmod(think_ms, 1000.0) * 1e6)};
                nanosleep(&pause, NULL);
            }
        }
    }
    double stop = now();
    getrusage(RUSAGE_SELF, &ru1);
    have_ss = have_ss && read_schedstat(ss1);
    if (think_ms <= 0 && first >= 0 && last > first) busy = last - first;

    printf("{\"kernel\": \"%s\", \"size_kib\": %zu, \"units\": %ld, \"span_s\": %.9f, \"busy_s\": %.9f, "
           "\"elapsed_s\": %.9f, \"user_s\": %.6f, \"system_s\": %.6f, \"max_rss_kib\": %ld, "
           "\"minor_faults\": %ld, \"major_faults\": %ld, \"voluntary_switches\": %ld, "
           "\"involuntary_switches\": %ld",
           kernel, kib, units, last > first ? last - first : 0.0, busy, stop - go,
           tv(ru1.ru_utime) - tv(ru0.ru_utime), tv(ru1.ru_stime) - tv(ru0.ru_stime), read_peak_rss_kib(),
           ru1.ru_minflt - ru0.ru_minflt, ru1.ru_majflt - ru0.ru_majflt,
           ru1.ru_nvcsw - ru0.ru_nvcsw, ru1.ru_nivcsw - ru0.ru_nivcsw);
    if (have_ss)
        printf(", \"sched_run_ns\": %llu, \"sched_wait_ns\": %llu, \"sched_timeslices\": %llu",
               ss1[0] - ss0[0], ss1[1] - ss0[1], ss1[2] - ss0[2]);
    for (size_t i = 0; i < N_COUNTERS; i++) {
        uint64_t value;
        if (counters[i].fd >= 0 && read(counters[i].fd, &value, sizeof value) == (ssize_t)sizeof value)
            printf(", \"perf_%s\": %llu", counters[i].name, (unsigned long long)value);
    }
    printf("}\n");
    return 0;
}
