/* SPDX-License-Identifier: MIT */
/*
 * ncclGetUniqueId through the shim over the fake NCCL (FAKE_NCCL_ID_INET=1:
 * an id as NCCL makes it, with an IPv4 root address): NCCL's part of the id
 * comes back unchanged, and the last 64 bytes carry the rendezvous marker
 * (argument "marked") or stay zero ("unmarked", under MSCX_DISABLE).
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>

#include <nccl.h>

int main(int argc, char **argv)
{
    int want_mark = argc > 1 && strcmp(argv[1], "marked") == 0;
    ncclUniqueId id, nccl;
    memset(&id, 0xee, sizeof(id));
    if (ncclGetUniqueId(&id) != ncclSuccess) {
        fprintf(stderr, "FAIL: ncclGetUniqueId\n");
        return 1;
    }
    /* what the fake NCCL writes */
    memset(nccl.internal, 0x5a, 8);
    memset(nccl.internal + 8, 0, sizeof(nccl.internal) - 8);
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons(7)};
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    memcpy(nccl.internal + 8, &sin, sizeof(sin));
    int fails = 0;
    if (memcmp(id.internal, nccl.internal, 64) != 0) {
        fprintf(stderr, "FAIL: the first 64 bytes of the id are not NCCL's\n");
        fails++;
    }
    int marked = memcmp(id.internal + 64, "MSCXRDV", 7) == 0;
    if (want_mark && !marked) {
        fprintf(stderr, "FAIL: the id carries no marker\n");
        fails++;
    }
    if (!want_mark && memcmp(id.internal + 64, nccl.internal + 64, 64) != 0) {
        fprintf(stderr, "FAIL: the id's last 64 bytes changed\n");
        fails++;
    }
    return fails ? 1 : 0;
}
