/* SPDX-License-Identifier: MIT */
/**
 * @file status.h
 * The one status type of mscx. Zero is success, positive values are "not
 * finished yet", negative values are errors.
 */
#ifndef MSCX_STATUS_H
#define MSCX_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    MSCX_OK = 0,
    MSCX_INPROGRESS = 1,
    MSCX_ERR_INVALID_ARG = -1,
    MSCX_ERR_NO_MEMORY = -2,
    MSCX_ERR_CUDA = -3,
    MSCX_ERR_IBV = -4,
    MSCX_ERR_SYSTEM = -5,
    MSCX_ERR_PLAN = -6,
    MSCX_ERR_TIMEOUT = -7,
    MSCX_ERR_UNSUPPORTED = -8,
    MSCX_ERR_INTERNAL = -9,
    MSCX_ERR_REMOTE = -10, /* a peer failed or went away */
} mscx_status_t;

/**
 * @param status any mscx_status_t value
 * @return a static, human-readable description; never NULL
 */
const char *mscx_status_str(mscx_status_t status);

/** Return from the enclosing function when @p call does not return MSCX_OK. */
#define MSCX_CHECK(call)                                                                                     \
    do {                                                                                                     \
        mscx_status_t mscx_check_st_ = (call);                                                               \
        if (mscx_check_st_ != MSCX_OK)                                                                       \
            return mscx_check_st_;                                                                           \
    } while (0)

/** Store the status of @p call in @p st and jump to @p label when it is not MSCX_OK. */
#define MSCX_CHECK_GOTO(call, st, label)                                                                     \
    do {                                                                                                     \
        (st) = (call);                                                                                       \
        if ((st) != MSCX_OK)                                                                                 \
            goto label;                                                                                      \
    } while (0)

#ifdef __cplusplus
}
#endif
#endif /* MSCX_STATUS_H */
