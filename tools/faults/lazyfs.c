/*
 * hac-lazyfs: a FUSE file system that keeps every write apart until it is synced
 * (the LazyFS approach), for the power-loss drills of ha-controller.
 *
 *   hac-lazyfs BACKING MOUNTPOINT
 *
 * MOUNTPOINT shows BACKING.  File data written through it stays in this process's
 * memory, per file (by the backing file's device and inode), until fsync or fdatasync
 * of any descriptor of that file writes it to BACKING and syncs it there.  Killing this
 * process (SIGKILL) is the power loss: what was not synced is gone, BACKING holds what
 * a disk would hold.  Metadata operations (create, mkdir, unlink, rename, truncate,
 * chmod, utimens) go to BACKING at once and are durable at once: the model is a file
 * system that journals metadata in order and loses unsynced data (it does not model
 * torn metadata).  A closed file keeps its unsynced data (a page cache does too);
 * a later open sees it.  Reads see the unsynced data; stat sees its size.
 *
 * Single-threaded (fuse_main -s): no locks.  Built by tools/build-faults.sh (make tools).
 */
#define FUSE_USE_VERSION 31
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fuse.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/time.h>
#include <unistd.h>

#define PAGE 4096
#define PAGE_BUCKETS 256
#define NODE_BUCKETS 1024

struct page {
	off_t no;
	struct page *next;
	char data[PAGE];
};

struct node {
	dev_t dev;
	ino_t ino;
	int refs;      /* open handles */
	int fd;        /* backing descriptor, O_RDWR */
	off_t size;    /* logical size: backing size plus unsynced growth */
	size_t dirty;  /* unsynced pages */
	struct page *pages[PAGE_BUCKETS];
	struct node *next;
};

static int backing = -1;  /* directory descriptor of BACKING */
static struct node *nodes[NODE_BUCKETS];

static const char *rel(const char *path) {
	while (*path == '/')
		path++;
	return *path ? path : ".";
}

static size_t node_bucket(dev_t dev, ino_t ino) {
	return (size_t)((dev * 31u + ino) % NODE_BUCKETS);
}

static struct node *node_find(dev_t dev, ino_t ino) {
	for (struct node *n = nodes[node_bucket(dev, ino)]; n; n = n->next)
		if (n->dev == dev && n->ino == ino)
			return n;
	return NULL;
}

static void pages_free(struct node *n, off_t from_page) {
	for (int b = 0; b < PAGE_BUCKETS; b++) {
		struct page **pp = &n->pages[b];
		while (*pp) {
			if ((*pp)->no >= from_page) {
				struct page *dead = *pp;
				*pp = dead->next;
				free(dead);
				n->dirty--;
			} else {
				pp = &(*pp)->next;
			}
		}
	}
}

static void node_drop(struct node *n) {
	struct node **pp = &nodes[node_bucket(n->dev, n->ino)];
	while (*pp && *pp != n)
		pp = &(*pp)->next;
	if (*pp)
		*pp = n->next;
	pages_free(n, 0);
	close(n->fd);
	free(n);
}

/* The node of an open backing descriptor (taking ownership of fd), refs + 1. */
static struct node *node_get(int fd) {
	struct stat st;
	if (fstat(fd, &st) < 0)
		return NULL;
	struct node *n = node_find(st.st_dev, st.st_ino);
	if (n) {
		close(fd);
		n->refs++;
		return n;
	}
	n = calloc(1, sizeof(*n));
	if (!n)
		return NULL;
	n->dev = st.st_dev;
	n->ino = st.st_ino;
	n->fd = fd;
	n->refs = 1;
	n->size = st.st_size;
	size_t b = node_bucket(n->dev, n->ino);
	n->next = nodes[b];
	nodes[b] = n;
	return n;
}

static void node_put(struct node *n) {
	if (--n->refs <= 0 && n->dirty == 0)
		node_drop(n);
}

static struct page *page_find(struct node *n, off_t no) {
	for (struct page *p = n->pages[no % PAGE_BUCKETS]; p; p = p->next)
		if (p->no == no)
			return p;
	return NULL;
}

/* The dirty page ``no``, made from the backing file's bytes when it is new. */
static struct page *page_get(struct node *n, off_t no) {
	struct page *p = page_find(n, no);
	if (p)
		return p;
	p = calloc(1, sizeof(*p));
	if (!p)
		return NULL;
	p->no = no;
	ssize_t got = pread(n->fd, p->data, PAGE, no * PAGE);
	if (got < 0) {
		free(p);
		return NULL;
	}
	p->next = n->pages[no % PAGE_BUCKETS];
	n->pages[no % PAGE_BUCKETS] = p;
	n->dirty++;
	return p;
}

static int node_sync(struct node *n, int datasync) {
	for (int b = 0; b < PAGE_BUCKETS; b++) {
		for (struct page *p = n->pages[b]; p; p = p->next) {
			off_t at = p->no * PAGE;
			if (at >= n->size)
				continue;
			size_t len = (size_t)(n->size - at < PAGE ? n->size - at : PAGE);
			size_t done = 0;
			while (done < len) {
				ssize_t w = pwrite(n->fd, p->data + done, len - done, at + (off_t)done);
				if (w < 0)
					return -errno;
				done += (size_t)w;
			}
		}
	}
	struct stat st;
	if (fstat(n->fd, &st) < 0)
		return -errno;
	if (st.st_size != n->size && ftruncate(n->fd, n->size) < 0)
		return -errno;
	if ((datasync ? fdatasync(n->fd) : fsync(n->fd)) < 0)
		return -errno;
	pages_free(n, 0);
	return 0;
}

/* Forget the node of ``path`` when the path was its last link (unlink, rename over). */
static void forget_if_last(const char *path) {
	struct stat st;
	if (fstatat(backing, rel(path), &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(st.st_mode))
		return;
	struct node *n = node_find(st.st_dev, st.st_ino);
	if (n && st.st_nlink <= 1) {
		pages_free(n, 0);
		if (n->refs <= 0)
			node_drop(n);
	}
}

static struct node *fh_node(struct fuse_file_info *fi) {
	return (struct node *)(uintptr_t)fi->fh;
}

static void *lz_init(struct fuse_conn_info *conn, struct fuse_config *cfg) {
	(void)conn;
	cfg->use_ino = 1;
	cfg->attr_timeout = 0;
	cfg->entry_timeout = 0;
	cfg->negative_timeout = 0;
	cfg->direct_io = 1; /* no kernel page cache: every read asks us */
	return NULL;
}

static int lz_getattr(const char *path, struct stat *st, struct fuse_file_info *fi) {
	if (fi && fi->fh) {
		struct node *n = fh_node(fi);
		if (fstat(n->fd, st) < 0)
			return -errno;
		st->st_size = n->size;
		return 0;
	}
	if (fstatat(backing, rel(path), st, AT_SYMLINK_NOFOLLOW) < 0)
		return -errno;
	struct node *n = S_ISREG(st->st_mode) ? node_find(st->st_dev, st->st_ino) : NULL;
	if (n)
		st->st_size = n->size;
	return 0;
}

static int lz_readdir(const char *path, void *buf, fuse_fill_dir_t fill, off_t off,
		      struct fuse_file_info *fi, enum fuse_readdir_flags flags) {
	(void)off;
	(void)fi;
	(void)flags;
	int fd = openat(backing, rel(path), O_RDONLY | O_DIRECTORY);
	if (fd < 0)
		return -errno;
	DIR *d = fdopendir(fd);
	if (!d) {
		close(fd);
		return -errno;
	}
	struct dirent *e;
	while ((e = readdir(d)) != NULL) {
		struct stat st;
		memset(&st, 0, sizeof(st));
		st.st_ino = e->d_ino;
		st.st_mode = (mode_t)(e->d_type << 12);
		if (fill(buf, e->d_name, &st, 0, 0))
			break;
	}
	closedir(d);
	return 0;
}

static int open_node(const char *path, int flags, mode_t mode, struct fuse_file_info *fi) {
	int fd = openat(backing, rel(path), (flags & ~(O_ACCMODE | O_APPEND)) | O_RDWR, mode);
	if (fd < 0 && errno == EISDIR)
		return -EISDIR;
	if (fd < 0)
		return -errno;
	struct node *n = node_get(fd);
	if (!n) {
		close(fd);
		return -ENOMEM;
	}
	if (flags & O_TRUNC) {
		if (ftruncate(n->fd, 0) < 0)
			return -errno;
		pages_free(n, 0);
		n->size = 0;
	}
	fi->fh = (uint64_t)(uintptr_t)n;
	fi->direct_io = 1;
	return 0;
}

static int lz_open(const char *path, struct fuse_file_info *fi) {
	return open_node(path, fi->flags & ~O_CREAT, 0, fi);
}

static int lz_create(const char *path, mode_t mode, struct fuse_file_info *fi) {
	return open_node(path, fi->flags | O_CREAT, mode, fi);
}

static int lz_read(const char *path, char *buf, size_t size, off_t off,
		   struct fuse_file_info *fi) {
	(void)path;
	struct node *n = fh_node(fi);
	if (off >= n->size)
		return 0;
	if ((off_t)size > n->size - off)
		size = (size_t)(n->size - off);
	size_t done = 0;
	while (done < size) {
		ssize_t r = pread(n->fd, buf + done, size - done, off + (off_t)done);
		if (r < 0)
			return -errno;
		if (r == 0)
			break;
		done += (size_t)r;
	}
	memset(buf + done, 0, size - done); /* unsynced growth past the backing end */
	if (n->dirty) {
		for (off_t no = off / PAGE; no * PAGE < off + (off_t)size; no++) {
			struct page *p = page_find(n, no);
			if (!p)
				continue;
			off_t from = no * PAGE > off ? no * PAGE : off;
			off_t to = (no + 1) * PAGE < off + (off_t)size ? (no + 1) * PAGE : off + (off_t)size;
			memcpy(buf + (from - off), p->data + (from - no * PAGE), (size_t)(to - from));
		}
	}
	return (int)size;
}

static int lz_write(const char *path, const char *buf, size_t size, off_t off,
		    struct fuse_file_info *fi) {
	(void)path;
	struct node *n = fh_node(fi);
	size_t done = 0;
	while (done < size) {
		off_t at = off + (off_t)done;
		struct page *p = page_get(n, at / PAGE);
		if (!p)
			return done ? (int)done : -ENOMEM;
		size_t in_page = (size_t)(at % PAGE);
		size_t len = PAGE - in_page < size - done ? PAGE - in_page : size - done;
		memcpy(p->data + in_page, buf + done, len);
		done += len;
	}
	if (off + (off_t)size > n->size)
		n->size = off + (off_t)size;
	return (int)size;
}

static int lz_fsync(const char *path, int datasync, struct fuse_file_info *fi) {
	(void)path;
	return node_sync(fh_node(fi), datasync);
}

static int lz_flush(const char *path, struct fuse_file_info *fi) {
	(void)path;
	(void)fi;
	return 0; /* close() is no sync */
}

static int lz_release(const char *path, struct fuse_file_info *fi) {
	(void)path;
	node_put(fh_node(fi));
	return 0;
}

static int lz_truncate(const char *path, off_t size, struct fuse_file_info *fi) {
	struct node *n = fi && fi->fh ? fh_node(fi) : NULL;
	int rc = n ? ftruncate(n->fd, size) : 0;
	if (!n) {
		int fd = openat(backing, rel(path), O_WRONLY);
		if (fd < 0)
			return -errno;
		rc = ftruncate(fd, size);
		struct stat st;
		if (rc == 0 && fstat(fd, &st) == 0)
			n = node_find(st.st_dev, st.st_ino);
		close(fd);
	}
	if (rc < 0)
		return -errno;
	if (n) {
		pages_free(n, (size + PAGE - 1) / PAGE);
		struct page *last = size % PAGE ? page_find(n, size / PAGE) : NULL;
		if (last)
			memset(last->data + size % PAGE, 0, PAGE - (size_t)(size % PAGE));
		n->size = size;
	}
	return 0;
}

static int lz_fallocate(const char *path, int mode, off_t off, off_t len,
			struct fuse_file_info *fi) {
	(void)path;
	struct node *n = fh_node(fi);
	if (mode)
		return -EOPNOTSUPP;
	if (fallocate(n->fd, 0, off, len) < 0)
		return -errno;
	if (off + len > n->size)
		n->size = off + len;
	return 0;
}

static int lz_unlink(const char *path) {
	forget_if_last(path);
	return unlinkat(backing, rel(path), 0) < 0 ? -errno : 0;
}

static int lz_rename(const char *from, const char *to, unsigned int flags) {
	if (flags)
		return -EINVAL;
	forget_if_last(to);
	return renameat(backing, rel(from), backing, rel(to)) < 0 ? -errno : 0;
}

static int lz_mkdir(const char *path, mode_t mode) {
	return mkdirat(backing, rel(path), mode) < 0 ? -errno : 0;
}

static int lz_rmdir(const char *path) {
	return unlinkat(backing, rel(path), AT_REMOVEDIR) < 0 ? -errno : 0;
}

static int lz_chmod(const char *path, mode_t mode, struct fuse_file_info *fi) {
	(void)fi;
	return fchmodat(backing, rel(path), mode, 0) < 0 ? -errno : 0;
}

static int lz_chown(const char *path, uid_t uid, gid_t gid, struct fuse_file_info *fi) {
	(void)fi;
	return fchownat(backing, rel(path), uid, gid, AT_SYMLINK_NOFOLLOW) < 0 ? -errno : 0;
}

static int lz_utimens(const char *path, const struct timespec tv[2],
		      struct fuse_file_info *fi) {
	(void)fi;
	return utimensat(backing, rel(path), tv, AT_SYMLINK_NOFOLLOW) < 0 ? -errno : 0;
}

static int lz_statfs(const char *path, struct statvfs *st) {
	(void)path;
	return fstatvfs(backing, st) < 0 ? -errno : 0;
}

static int lz_fsyncdir(const char *path, int datasync, struct fuse_file_info *fi) {
	(void)path;
	(void)datasync;
	(void)fi;
	return 0; /* metadata is durable at once */
}

static const struct fuse_operations ops = {
	.init = lz_init,
	.getattr = lz_getattr,
	.readdir = lz_readdir,
	.open = lz_open,
	.create = lz_create,
	.read = lz_read,
	.write = lz_write,
	.fsync = lz_fsync,
	.flush = lz_flush,
	.release = lz_release,
	.truncate = lz_truncate,
	.fallocate = lz_fallocate,
	.unlink = lz_unlink,
	.rename = lz_rename,
	.mkdir = lz_mkdir,
	.rmdir = lz_rmdir,
	.chmod = lz_chmod,
	.chown = lz_chown,
	.utimens = lz_utimens,
	.statfs = lz_statfs,
	.fsyncdir = lz_fsyncdir,
};

int main(int argc, char *argv[]) {
	if (argc != 3) {
		fprintf(stderr, "usage: %s BACKING MOUNTPOINT\n", argv[0]);
		return 2;
	}
	backing = open(argv[1], O_RDONLY | O_DIRECTORY);
	if (backing < 0) {
		perror(argv[1]);
		return 2;
	}
	char *fargv[] = {argv[0], "-f", "-s", "-o", "fsname=hac-lazyfs,default_permissions",
			 argv[2], NULL};
	return fuse_main(6, fargv, &ops, NULL);
}
