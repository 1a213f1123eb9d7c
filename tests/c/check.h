/* The C suites' check macro: counts passed and failed checks, prints each failure with its
 * line. A suite ends with `C-SUITE passed=N failed=M` (CHECK_SUMMARY). */
#ifndef UGDS_TEST_CHECK_H
#define UGDS_TEST_CHECK_H
#include <stdio.h>

static int passed, failed;

#define CHECK(cond, ...)                                                    \
    do {                                                                    \
        if (cond) {                                                         \
            passed++;                                                       \
        } else {                                                            \
            failed++;                                                       \
            printf("not ok - %s:%d: ", __FILE__, __LINE__);                 \
            printf(__VA_ARGS__);                                            \
            printf("\n");                                                   \
        }                                                                   \
    } while (0)

#define RETURNS(call, want) \
    do { ssize_t r_ = (call); CHECK(r_ == (ssize_t)(want), "%s returned %zd, expected %s", #call, r_, #want); } while (0)

#define CHECK_SUMMARY() (printf("C-SUITE passed=%d failed=%d\n", passed, failed), failed ? 1 : 0)
#endif
