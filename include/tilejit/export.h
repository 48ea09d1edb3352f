/* tilejit/export.h — the one export macro. Every function of the public API is declared TJ_API;
 * the library is built with hidden visibility, so nothing else is exported. */
#ifndef TILEJIT_EXPORT_H
#define TILEJIT_EXPORT_H

#if defined(TJ_BUILDING_LIBRARY) && defined(__GNUC__)
#define TJ_API __attribute__((visibility("default")))
#elif defined(__GNUC__)
#define TJ_API
#else
#define TJ_API
#endif

#endif
