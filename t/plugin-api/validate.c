/*
 * Runs the C manifest validator on one manifest for t/plugin-api:
 *
 *   validate <meta.json> '<exports JSON array>'
 *
 * Prints {"ok":true,"normalized":{...}} or {"ok":false,"errors":[...]};
 * exit status 0 accepted, 1 rejected, 2 usage or I/O error.
 */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmgw.h"


static char *
slurp(const char *path, size_t *len)
{
    FILE    *f = fopen(path, "rb");
    char    *buf = NULL;
    size_t   cap = 0, n = 0, r;

    if (f == NULL) {
        return NULL;
    }

    do {
        if (n + 4096 > cap) {
            cap = (cap + 4096) * 2;
            buf = realloc(buf, cap);
            if (buf == NULL) {
                fclose(f);
                return NULL;
            }
        }

        r = fread(buf + n, 1, cap - n, f);
        n += r;
    } while (r > 0);

    fclose(f);
    *len = n;
    return buf;
}


int
main(int argc, char **argv)
{
    llmgw_buf_t  norm, errs;
    size_t       len;
    char        *meta;
    int          rc;

    if (argc != 3) {
        fprintf(stderr, "usage: %s <meta.json> '<exports JSON array>'\n",
                argv[0]);
        return 2;
    }

    meta = slurp(argv[1], &len);

    if (meta == NULL) {
        perror(argv[1]);
        return 2;
    }

    rc = llmgw_manifest_validate(meta, len, argv[2], strlen(argv[2]), &norm,
                                 &errs);

    if (rc == 0) {
        printf("{\"ok\":true,\"normalized\":%s}\n", norm.data);
    } else {
        printf("{\"ok\":false,\"errors\":%s}\n",
               errs.data != NULL ? errs.data : "[]");
    }

    llmgw_buf_free(&norm);
    llmgw_buf_free(&errs);
    free(meta);
    return rc == 0 ? 0 : 1;
}
