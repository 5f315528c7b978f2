/* SPDX-License-Identifier: Apache-2.0 */
/* ferry info: what this build and this machine give Ferry, in the manner of
 * ucx_info: version, build options, the transports usable here (and why
 * not), devices found, the effective FERRY_* settings. --json: one object. */
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include <jansson.h>

#include <ferry/ferry.h>

#include "cli.h"
#include "link/transport.h"
#include "engine/xport.h"
#include "meta/meta.h"
#include "transport/rdma/rdma.h"
#include "util.h"

extern char **environ;

static json_t *build_json(void)
{
    json_t *meta = json_array();
    static const char *const schemes[] = {"p2p", "etcd", "redis", "http"};
    for (size_t i = 0; i < sizeof schemes / sizeof *schemes; i++)
        if (ferry_meta_backend_built(schemes[i])) json_array_append_new(meta, json_string(schemes[i]));
    const char *cuda_why = NULL;
    ferry_device_memory_supported(&cuda_why);
    const char *sanitizer = "none";
#if defined(__SANITIZE_ADDRESS__)
    sanitizer = "address";
#elif defined(__SANITIZE_THREAD__)
    sanitizer = "thread";
#endif
#ifdef __clang__
    const char *compiler = "clang " __clang_version__;
#else
    const char *compiler = "gcc " __VERSION__;
#endif
    return json_pack("{s:s,s:s,s:b,s:o,s:b,s:s}", "compiler", compiler, "sanitizer", sanitizer, "assertions",
#ifdef NDEBUG
                     0,
#else
                     1,
#endif
                     "metadata_backends", meta, "rdma_verbs", ferry_rdma_built(), "cuda", cuda_why ? cuda_why : "");
}

/* shm: single-copy cross-memory attach between processes of one host. */
static json_t *shm_json(void)
{
    const char *off = getenv("FERRY_SHM_DISABLE");
    if (off && *off && strcmp(off, "0") != 0)
        return json_pack("{s:b,s:s}", "usable", 0, "reason", "FERRY_SHM_DISABLE is set: this engine refuses it");
    /* The system call itself, on this process (seccomp or a kernel
     * without CONFIG_CROSS_MEMORY_ATTACH refuse it). */
    char src[8] = "ferry", dst[8] = "";
    struct iovec l = {dst, sizeof dst}, r = {src, sizeof src};
    if (process_vm_readv(getpid(), &l, 1, &r, 1, 0) != (ssize_t)sizeof dst) {
        char why[160];
        snprintf(why, sizeof why, "process_vm_readv refused here: %s", strerror(errno));
        return json_pack("{s:b,s:s}", "usable", 0, "reason", why);
    }
    char yama[160] = "";
    FILE *f = fopen("/proc/sys/kernel/yama/ptrace_scope", "r");
    int scope = -1;
    if (f) {
        if (fscanf(f, "%d", &scope) != 1) scope = -1;
        fclose(f);
    }
    if (scope >= 2) snprintf(yama, sizeof yama, "; but Yama ptrace_scope=%d refuses attaching to peers", scope);
    char why[300];
    snprintf(why, sizeof why, "with peers on this host: process_vm_readv/writev works%s%s", yama,
             scope == 1 ? " (Yama ptrace_scope=1: targets allow same-user initiators, PR_SET_PTRACER)" : "");
    return json_pack("{s:b,s:s}", "usable", scope < 2, "reason", why);
}

static json_t *transports_json(json_t **devices)
{
    json_t *t = json_object();
    json_object_set_new(t, "tcp", json_pack("{s:b,s:s}", "usable", 1, "reason", "reaches every peer"));
    json_object_set_new(t, "shm", shm_json());
    /* RDMA: what an engine here would decide (an engine on loopback, port 0). */
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    cfg.host = "127.0.0.1";
    cfg.port = 0;
    ferry_engine_t *e = NULL;
    char why[512] = "";
    int usable = 0;
    if (ferry_engine_create(&cfg, &e) == 0) {
        usable = ferry_rdma_local(ferry_engine_xport(e), why, sizeof why);
        ferry_engine_destroy(e);
    } else {
        snprintf(why, sizeof why, "no engine to probe with: %s", ferry_last_error_detail());
    }
    json_object_set_new(t, "rdma", json_pack("{s:b,s:s}", "usable", usable, "reason", why));
    char names[512] = "";
    int n = ferry_rdma_sysfs_devices("/sys/class/infiniband_verbs", names, sizeof names);
    const char *cuda_why = NULL;
    int cuda = ferry_device_memory_supported(&cuda_why);
    json_t *ifs = json_array();
    struct ifaddrs *ifa = NULL;
    if (getifaddrs(&ifa) == 0) {
        for (struct ifaddrs *i = ifa; i; i = i->ifa_next) {
            if (!i->ifa_addr || (i->ifa_addr->sa_family != AF_INET && i->ifa_addr->sa_family != AF_INET6)) continue;
            char addr[INET6_ADDRSTRLEN] = "";
            const void *a = i->ifa_addr->sa_family == AF_INET ? (const void *)&((struct sockaddr_in *)i->ifa_addr)->sin_addr
                                                              : (const void *)&((struct sockaddr_in6 *)i->ifa_addr)->sin6_addr;
            inet_ntop(i->ifa_addr->sa_family, a, addr, sizeof addr);
            json_array_append_new(ifs, json_pack("{s:s,s:s,s:b}", "name", i->ifa_name, "address", addr, "up",
                                                 (i->ifa_flags & IFF_UP) != 0));
        }
        freeifaddrs(ifa);
    }
    *devices = json_pack("{s:{s:i,s:s},s:{s:b,s:s},s:o,s:i}", "rdma", "count", n, "names", names, "cuda", "usable",
                         cuda, "why", cuda_why ? cuda_why : "", "interfaces", ifs, "cpus",
                         (int)sysconf(_SC_NPROCESSORS_ONLN));
    return t;
}

/* The configuration an engine would get from this environment, and every
 * FERRY_* variable set (FERRY_SECRET's value is never shown). */
static json_t *settings_json(json_t **env_out, char *error, size_t cap)
{
    json_t *env = json_object();
    for (char **v = environ; *v; v++) {
        if (strncmp(*v, "FERRY_", 6) != 0) continue;
        const char *eq = strchr(*v, '=');
        if (!eq) continue;
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)(eq - *v), *v);
        json_object_set_new(env, name, json_string(strcmp(name, "FERRY_SECRET") == 0 ? "(set, not shown)" : eq + 1));
    }
    *env_out = env;
    ferry_config_t c;
    ferry_config_init(&c);
    error[0] = '\0';
    if (ferry_config_from_env(&c) != 0) snprintf(error, cap, "%s", ferry_last_error_detail());
    return json_pack("{s:s,s:i,s:s,s:s,s:i,s:i,s:i,s:i,s:I,s:i,s:i,s:b,s:i,s:b,s:i,s:i,s:i,s:i,s:i,s:i}", "host",
                     c.host ? c.host : "", "port", c.port, "metadata", c.metadata ? c.metadata : "", "transport",
                     c.transport ? c.transport : "", "timeout_ms", c.timeout_ms, "connect_timeout_ms",
                     c.connect_timeout_ms, "conns_per_peer", c.conns_per_peer, "workers", c.workers, "slice_size",
                     (json_int_t)c.slice_size, "retries", c.retries, "retry_backoff_ms", c.retry_backoff_ms, "checksum",
                     c.checksum, "keepalive_ms", c.keepalive_ms, "secret", c.secret != NULL, "log_level", c.log_level,
                     "metadata_ttl_s", c.metadata_ttl_s, "metrics_port", c.metrics_port, "cancel_timeout_ms",
                     c.cancel_timeout_ms, "spin_us", c.spin_us, "max_connections", c.max_connections);
}

/* Every configuration key the transports declare (their keys tables):
 * its transport, the value this environment gives it (or its default;
 * null: none), whether it is set, its help. A bad value sets error. */
static json_t *transport_settings_json(char *error, size_t cap)
{
    json_t *out = json_object();
    for (int i = 0; ferry_transports[i]; i++) {
        const ferry_transport_ops_t *t = ferry_transports[i];
        for (size_t k = 0; k < t->nkeys; k++) {
            const ferry_transport_key_t *key = &t->keys[k];
            long num = 0;
            const char *str = NULL;
            int rc = ferry_transport_key(key, &num, &str);
            if (rc < 0 && !error[0]) snprintf(error, cap, "%s", ferry_last_error_detail());
            json_t *value = rc < 0 ? json_null()
                            : key->type == FERRY_KEY_STRING ? (str ? json_string(str) : json_null())
                            : rc > 0 || (key->def && *key->def) ? json_integer(num)
                                                                : json_null();
            json_object_set_new(out, key->name,
                                json_pack("{s:s,s:o,s:b,s:s}", "transport", t->name, "value", value, "set", rc > 0,
                                          "help", key->help));
        }
    }
    return out;
}

static void print_text(json_t *info)
{
    json_t *v = json_object_get(info, "version"), *b = json_object_get(info, "build");
    printf("ferry %s (library %s, protocol %d)\n", json_string_value(json_object_get(v, "cli")),
           json_string_value(json_object_get(v, "library")), (int)json_integer_value(json_object_get(v, "protocol")));
    printf("\nbuild\n  compiler      %s\n  sanitizer     %s\n  assertions    %s\n  metadata      ",
           json_string_value(json_object_get(b, "compiler")), json_string_value(json_object_get(b, "sanitizer")),
           json_is_true(json_object_get(b, "assertions")) ? "on" : "off");
    size_t i;
    json_t *x;
    json_array_foreach(json_object_get(b, "metadata_backends"), i, x) printf("%s%s", i ? ", " : "", json_string_value(x));
    printf("\n  rdma verbs    %s\n", json_is_true(json_object_get(b, "rdma_verbs")) ? "built in" : "not built");
    printf("\ntransports usable here\n");
    const char *name;
    json_object_foreach(json_object_get(info, "transports"), name, x)
        printf("  %-5s %-4s %s\n", name, json_is_true(json_object_get(x, "usable")) ? "yes" : "no",
               json_string_value(json_object_get(x, "reason")));
    json_t *d = json_object_get(info, "devices");
    json_t *rd = json_object_get(d, "rdma");
    printf("\ndevices\n  rdma          %d%s%s\n  cuda          %s\n  cpus          %d\n",
           (int)json_integer_value(json_object_get(rd, "count")), *json_string_value(json_object_get(rd, "names")) ? ": " : "",
           json_string_value(json_object_get(rd, "names")), json_string_value(json_object_get(json_object_get(d, "cuda"), "why")),
           (int)json_integer_value(json_object_get(d, "cpus")));
    json_array_foreach(json_object_get(d, "interfaces"), i, x)
        printf("  %-13s %s%s\n", json_string_value(json_object_get(x, "name")), json_string_value(json_object_get(x, "address")),
               json_is_true(json_object_get(x, "up")) ? "" : " (down)");
    printf("\nsettings (what an engine gets from this environment)\n");
    const char *err = json_string_value(json_object_get(info, "settings_error"));
    if (err) printf("  ERROR: %s\n", err);
    json_object_foreach(json_object_get(info, "settings"), name, x) {
        char *s = json_dumps(x, JSON_ENCODE_ANY);
        printf("  %-20s %s\n", name, s ? s : "?");
        free(s);
    }
    printf("\ntransport settings (the keys each transport reads)\n");
    json_object_foreach(json_object_get(info, "transport_settings"), name, x) {
        char *s = json_dumps(json_object_get(x, "value"), JSON_ENCODE_ANY);
        printf("  %-22s %-6s %-8s %s%s\n", name, json_string_value(json_object_get(x, "transport")), s ? s : "?",
               json_string_value(json_object_get(x, "help")), json_is_true(json_object_get(x, "set")) ? "" : " (default)");
        free(s);
    }
    json_t *env = json_object_get(info, "environment");
    printf("\nFERRY_* variables set%s\n", json_object_size(env) ? "" : ": none");
    json_object_foreach(env, name, x) printf("  %s=%s\n", name, json_string_value(x));
}

static int cmd_info(int argc, char **argv)
{
    int json = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0) json = 1;
        else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            printf("usage: ferry info [--json]\n"
                   "Version, build options, the transports usable here and why not, devices found\n"
                   "(RDMA, CUDA, network interfaces) and the settings an engine would get from this\n"
                   "environment (FERRY_* variables; FERRY_SECRET's value is not shown), as ucx_info.\n");
            return 0;
        } else {
            fprintf(stderr, "ferry info: unexpected argument '%s'\nusage: ferry info [--json]\n", argv[i]);
            return 2;
        }
    }
    json_t *devices = NULL, *env = NULL;
    char err[1024];
    json_t *settings = settings_json(&env, err, sizeof err);
    json_t *transports = transports_json(&devices);
    json_t *info = json_pack("{s:{s:s,s:s,s:i},s:o,s:o,s:o,s:o,s:o}", "version", "cli", FERRY_VERSION_STRING, "library",
                             ferry_version(), "protocol", FERRY_PROTOCOL_VERSION, "build", build_json(), "transports",
                             transports, "devices", devices, "settings", settings, "environment", env);
    json_object_set_new(info, "transport_settings", transport_settings_json(err, sizeof err));
    if (err[0]) json_object_set_new(info, "settings_error", json_string(err));
    if (json) {
        json_incref(info);
        print_json_line(info);
    } else {
        print_text(info);
    }
    json_decref(info);
    return err[0] ? 1 : 0;
}

FERRY_COMMAND("info", cmd_info, "version, build options, transports usable here, devices, effective settings (--json)")
