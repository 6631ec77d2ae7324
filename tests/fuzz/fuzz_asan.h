/*
 * fuzz_asan.h - FUZZ_HAVE_ASAN when AddressSanitizer is on (gcc or clang),
 * and then its allocator hooks, which targets use to bound what a parser
 * allocates or holds (fuzz_kserve, fuzz_tokenizer). gcc ships no header for
 * them; libasan has the functions.
 */
#ifndef FERRY_FUZZ_ASAN_H
#define FERRY_FUZZ_ASAN_H

#include <stddef.h>

#if defined(__SANITIZE_ADDRESS__) /* gcc */
#define FUZZ_HAVE_ASAN 1
#elif defined(__has_feature)      /* clang */
#if __has_feature(address_sanitizer)
#define FUZZ_HAVE_ASAN 1
#endif
#endif
#ifdef FUZZ_HAVE_ASAN
#if __has_include(<sanitizer/allocator_interface.h>)
#include <sanitizer/allocator_interface.h>
#else
int __sanitizer_install_malloc_and_free_hooks(void (*malloc_hook)(const volatile void *, size_t),
                                              void (*free_hook)(const volatile void *));
size_t __sanitizer_get_allocated_size(const volatile void *p);
#endif
#endif

#endif
