# Fails when a source file of one layer includes a header of a layer it does not link to: the
# build's own statement of "dependencies point down" (docs/ARCHITECTURE.md). Run by the build for
# each folder whenever one of its files changes (see deltafin_layer in src/CMakeLists.txt):
#   cmake -DROOT=<src> -DFOLDER=<folder> -DALLOWED=<a;b;..> -DLAYERS=<all folders> [-DSTAMP=<file>]
#         -P check_layers.cmake
# Only quoted includes whose first path part names a layer folder are checked; system and
# third-party headers use angle brackets.
file(GLOB_RECURSE files "${ROOT}/${FOLDER}/*.h" "${ROOT}/${FOLDER}/*.cpp")
set(errors "")
foreach(f IN LISTS files)
  file(STRINGS "${f}" lines REGEX "^[ \t]*#[ \t]*include[ \t]*\"[^\"]+\"")
  foreach(line IN LISTS lines)
    string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*\"([^\"]+)\".*$" "\\1" inc "${line}")
    string(REGEX MATCH "^[^/]+" top "${inc}")
    if(NOT inc MATCHES "/")
      continue()
    endif()
    list(FIND LAYERS "${top}" known)
    list(FIND ALLOWED "${top}" ok)
    if(known GREATER -1 AND ok EQUAL -1)
      file(RELATIVE_PATH rel "${ROOT}" "${f}")
      string(REPLACE ";" ", " allowed_text "${ALLOWED}")
      string(APPEND errors "  ${rel} includes \"${inc}\": ${FOLDER} may include only ${allowed_text}\n")
    endif()
  endforeach()
endforeach()
if(errors)
  message(FATAL_ERROR "wrong-way includes (a layer may use only the layers below it; "
                      "see docs/ARCHITECTURE.md):\n${errors}")
endif()
if(STAMP)
  file(TOUCH "${STAMP}")
endif()
