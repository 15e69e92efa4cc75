/*
 * libhac-clock.so: an LD_PRELOAD shim that steps one process's wall clock, for the
 * clock drills of ha-controller.
 *
 *   HAC_CLOCK_FILE=FILE LD_PRELOAD=.../libhac-clock.so PROGRAM ...
 *
 * FILE holds one signed 64-bit integer (native byte order) at offset 0: nanoseconds
 * added to CLOCK_REALTIME (and CLOCK_REALTIME_COARSE, gettimeofday, time).  The shim
 * maps FILE shared and reads the offset on every call, so a controller that rewrites
 * it steps the clock at once.  CLOCK_MONOTONIC and CLOCK_BOOTTIME are never touched
 * (an NTP step moves the wall clock only).  Without HAC_CLOCK_FILE, or when FILE
 * cannot be mapped, the clock is the real one.  Built by tools/build-faults.sh.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static const volatile int64_t *offset_ns;
static int (*real_clock_gettime)(clockid_t, struct timespec *);

__attribute__((constructor)) static void hac_clock_init(void) {
	real_clock_gettime = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
	const char *path = getenv("HAC_CLOCK_FILE");
	if (!path)
		return;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return;
	void *p = mmap(NULL, sizeof(int64_t), PROT_READ, MAP_SHARED, fd, 0);
	close(fd);
	if (p != MAP_FAILED)
		offset_ns = (const volatile int64_t *)p;
}

static void shift(struct timespec *ts) {
	int64_t off = offset_ns ? *offset_ns : 0;
	if (!off)
		return;
	int64_t ns = (int64_t)ts->tv_sec * 1000000000LL + ts->tv_nsec + off;
	ts->tv_sec = (time_t)(ns / 1000000000LL);
	ts->tv_nsec = (long)(ns % 1000000000LL);
	if (ts->tv_nsec < 0) {
		ts->tv_sec -= 1;
		ts->tv_nsec += 1000000000L;
	}
}

int clock_gettime(clockid_t clk, struct timespec *ts) {
	if (!real_clock_gettime)
		real_clock_gettime =
			(int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
	int rc = real_clock_gettime(clk, ts);
	if (rc == 0 && (clk == CLOCK_REALTIME || clk == CLOCK_REALTIME_COARSE))
		shift(ts);
	return rc;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
	(void)tz;
	struct timespec ts;
	int rc = clock_gettime(CLOCK_REALTIME, &ts);
	if (rc == 0) {
		tv->tv_sec = ts.tv_sec;
		tv->tv_usec = ts.tv_nsec / 1000;
	}
	return rc;
}

time_t time(time_t *out) {
	struct timespec ts;
	if (clock_gettime(CLOCK_REALTIME, &ts) != 0)
		return (time_t)-1;
	if (out)
		*out = ts.tv_sec;
	return ts.tv_sec;
}
