/* cdi-containerimage-server: serves the one disk image of a containerDisk image over HTTP, from inside
 * that image (registry `pullMethod: node`, CDI's tools/cdi-containerimage-server). The importer pod's
 * init container copies it into the shared emptyDir; the user's image runs it as a container, so it
 * must run in an image that has nothing else: it is linked statically and uses no name service.
 *
 *   server -p PORT -image-dir DIR -ready-file FILE -done-file FILE
 *
 * It checks that DIR holds exactly one regular file, listens on $POD_IP (localhost without it),
 * writes that file's name to the ready file, serves GET and HEAD of it (single byte ranges, as the
 * importer reads it) and `/info` (its environment, as JSON), and exits 0 once the done file appears
 * (the importer creates it when it has finished, whatever the outcome). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

static char image_path[4096];
static char image_name[256];

static void die(const char *what) {
    fprintf(stderr, "cdi-containerimage-server: %s: %s\n", what, strerror(errno));
    exit(1);
}

static int find_image(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) die(dir);
    struct dirent *e;
    int count = 0;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        count++;
        snprintf(image_name, sizeof image_name, "%s", e->d_name);
    }
    closedir(d);
    if (count != 1) return -1;
    snprintf(image_path, sizeof image_path, "%s/%s", dir, image_name);
    struct stat st;
    if (lstat(image_path, &st) != 0 || !S_ISREG(st.st_mode)) return -1;
    return 0;
}

static int write_all(int fd, const char *buf, size_t len) {
    while (len > 0) {
        ssize_t n = write(fd, buf, len);
        if (n < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        buf += n;
        len -= (size_t)n;
    }
    return 0;
}

static int reply(int fd, const char *status, const char *extra, const char *body, int keep) {
    char head[1024];
    size_t len = body ? strlen(body) : 0;
    int n = snprintf(head, sizeof head, "HTTP/1.1 %s\r\nContent-Length: %zu\r\n%s%s\r\n", status, len,
                     extra ? extra : "", keep ? "" : "Connection: close\r\n");
    if (write_all(fd, head, (size_t)n) || (body && write_all(fd, body, len))) return -1;
    return 0;
}

/* the environment as {"Env": ["K=V", ...]} (CDI's ServerInfo) */
static char *info_json(void) {
    size_t cap = 64, len = 0;
    for (char **e = environ; *e; e++) cap += strlen(*e) * 6 + 4;
    char *out = malloc(cap);
    if (!out) return NULL;
    len += (size_t)sprintf(out, "{\"Env\":[");
    for (char **e = environ; *e; e++) {
        if (e != environ) out[len++] = ',';
        out[len++] = '"';
        for (const unsigned char *c = (const unsigned char *)*e; *c; c++) {
            if (*c == '"' || *c == '\\') {
                out[len++] = '\\';
                out[len++] = (char)*c;
            } else if (*c < 0x20) {
                len += (size_t)sprintf(out + len, "\\u%04x", *c);
            } else {
                out[len++] = (char)*c;
            }
        }
        out[len++] = '"';
    }
    len += (size_t)sprintf(out + len, "]}\n");
    return out;
}

/* one request: 0 to read the next one, -1 to close */
static int serve_one(int fd, char *buf, size_t *used, size_t cap) {
    char *end;
    while (!(end = memmem(buf, *used, "\r\n\r\n", 4))) {
        if (*used == cap) return reply(fd, "431 Request Header Fields Too Large", NULL, "", 0), -1;
        ssize_t n = read(fd, buf + *used, cap - *used);
        if (n <= 0) return -1;
        *used += (size_t)n;
    }
    size_t head_len = (size_t)(end - buf) + 4;
    char head[8192];
    memcpy(head, buf, head_len - 2);
    head[head_len - 2] = 0;
    memmove(buf, buf + head_len, *used - head_len);
    *used -= head_len;

    char method[16], target[2048], version[16];
    if (sscanf(head, "%15s %2047s %15s", method, target, version) != 3)
        return reply(fd, "400 Bad Request", NULL, "", 0), -1;
    int keep = strcmp(version, "HTTP/1.0") != 0;
    long long first = -1, last = -1;
    int ranged = 0;
    for (char *line = strstr(head, "\r\n"); line; line = strstr(line + 2, "\r\n")) {
        char *h = line + 2;
        char *eol = strstr(h, "\r\n");
        char *close_word = strcasestr(h, "close");
        if (!strncasecmp(h, "Connection:", 11) && close_word && (!eol || close_word < eol)) keep = 0;
        if (!strncasecmp(h, "Range:", 6)) {
            char *spec = strstr(h, "bytes=");
            if (spec) {
                ranged = 1;
                spec += 6;
                if (*spec == '-') {
                    ranged = 2;  /* a suffix range */
                    last = strtoll(spec + 1, NULL, 10);
                } else {
                    char *dash;
                    first = strtoll(spec, &dash, 10);
                    if (*dash == '-' && dash[1] >= '0' && dash[1] <= '9') last = strtoll(dash + 1, NULL, 10);
                }
            }
        }
    }
    int is_head = !strcmp(method, "HEAD");
    if (strcmp(method, "GET") && !is_head) return reply(fd, "405 Method Not Allowed", NULL, "", keep) ? -1 : (keep ? 0 : -1);
    if (!strcmp(target, "/info")) {
        char *json = info_json();
        int r = reply(fd, "200 OK", "Content-Type: application/json\r\n", json ? json : "{}", keep);
        free(json);
        return r || !keep ? -1 : 0;
    }
    if (target[0] != '/' || strcmp(target + 1, image_name))
        return reply(fd, "404 Not Found", NULL, "", keep) || !keep ? -1 : 0;
    int file = open(image_path, O_RDONLY | O_CLOEXEC);
    if (file < 0) return reply(fd, "500 Internal Server Error", NULL, "", 0), -1;
    struct stat st;
    fstat(file, &st);
    long long size = st.st_size, start = 0, count = size;
    char extra[256];
    const char *status = "200 OK";
    snprintf(extra, sizeof extra, "Accept-Ranges: bytes\r\n");
    if (ranged) {
        if (ranged == 2) {
            start = last >= size ? 0 : size - last;
            last = size - 1;
        } else {
            start = first;
            if (last < 0 || last >= size) last = size - 1;
        }
        if (start < 0 || start >= size || last < start) {
            snprintf(extra, sizeof extra, "Content-Range: bytes */%lld\r\n", size);
            close(file);
            return reply(fd, "416 Range Not Satisfiable", extra, "", keep) || !keep ? -1 : 0;
        }
        count = last - start + 1;
        status = "206 Partial Content";
        snprintf(extra, sizeof extra, "Accept-Ranges: bytes\r\nContent-Range: bytes %lld-%lld/%lld\r\n", start, last,
                 size);
    }
    char hdr[1024];
    int n = snprintf(hdr, sizeof hdr,
                     "HTTP/1.1 %s\r\nContent-Length: %lld\r\nContent-Type: application/octet-stream\r\n%s%s\r\n",
                     status, count, extra, keep ? "" : "Connection: close\r\n");
    if (write_all(fd, hdr, (size_t)n)) return close(file), -1;
    if (!is_head) {
        off_t off = start;
        long long left = count;
        while (left > 0) {
            ssize_t sent = sendfile(fd, file, &off, left > (1 << 30) ? (1 << 30) : (size_t)left);
            if (sent < 0 && errno == EINTR) continue;
            if (sent <= 0) return close(file), -1;
            left -= sent;
        }
    }
    close(file);
    return keep ? 0 : -1;
}

static void serve(int fd) {
    static char buf[16384];
    size_t used = 0;
    while (serve_one(fd, buf, &used, sizeof buf) == 0) {
    }
    close(fd);
    _exit(0);
}

int main(int argc, char **argv) {
    int port = 8100;
    const char *dir = ".", *ready = "/shared/ready", *done = "/shared/done";
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *flag = argv[i];
        while (*flag == '-') flag++;
        if (!strcmp(flag, "p")) port = atoi(argv[i + 1]);
        else if (!strcmp(flag, "image-dir")) dir = argv[i + 1];
        else if (!strcmp(flag, "ready-file")) ready = argv[i + 1];
        else if (!strcmp(flag, "done-file")) done = argv[i + 1];
        else {
            fprintf(stderr, "cdi-containerimage-server: unknown flag %s\n", argv[i]);
            return 2;
        }
    }
    struct stat st;
    if (stat("/sysroot", &st) == 0 || stat("/ostree", &st) == 0) {
        fprintf(stderr, "bootc image detected: this image contains an ostree-based bootable OS and cannot be "
                        "imported as a regular container disk\n");
        return 1;
    }
    if (find_image(dir) != 0) {
        fprintf(stderr, "Failed get image filename in %s: Invalid container image\n", dir);
        return 1;
    }
    signal(SIGCHLD, SIG_IGN);
    signal(SIGPIPE, SIG_IGN);
    const char *ip = getenv("POD_IP");
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((unsigned short)port)};
    if (inet_pton(AF_INET, ip && *ip ? ip : "127.0.0.1", &addr.sin_addr) != 1) {
        fprintf(stderr, "cdi-containerimage-server: bad POD_IP %s\n", ip);
        return 1;
    }
    int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (listener < 0 || bind(listener, (struct sockaddr *)&addr, sizeof addr) || listen(listener, 64))
        die("listen");
    int rf = open(ready, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (rf < 0 || write_all(rf, image_name, strlen(image_name)) || close(rf)) die(ready);
    fprintf(stderr, "Serving %s on HTTP port: %d\n", dir, port);
    for (;;) {
        struct pollfd p = {.fd = listener, .events = POLLIN};
        int r = poll(&p, 1, 500);
        if (stat(done, &st) == 0) break;
        if (r <= 0) continue;
        int fd = accept4(listener, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) continue;
        pid_t child = fork();
        if (child == 0) {
            close(listener);
            serve(fd);
        }
        close(fd);
    }
    unlink(done);
    unlink(ready);
    fprintf(stderr, "Importer has completed\n");
    return 0;
}
