/* A C program that takes malloc's address in its code, as Ubuntu's /usr/bin/python3.12 does. Built
 * as a non-PIE executable, its PLT stub becomes malloc's address everywhere (a canonical PLT
 * entry), so a lookup of "malloc" names the executable although it does not define malloc. Holds
 * 64 MiB from malloc, every page touched. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
void *(*volatile alloc_fn)(size_t);
int main(void) {
    alloc_fn = malloc;   /* the address taken in code: a canonical PLT entry in a non-PIE executable */
    char *p = alloc_fn(64 << 20);
    memset(p, 1, 64 << 20);
    printf("%d\n", p[12345]);
    free(p);
    return 0;
}
