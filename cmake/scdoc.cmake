# SPDX-License-Identifier: BSD-3-Clause
# cmake -DSCDOC=scdoc -DIN=page.1.scd -DOUT=page.1 -P scdoc.cmake: scdoc reads
# standard input and writes standard output; a failed run leaves no page.
execute_process(COMMAND ${SCDOC} INPUT_FILE ${IN} OUTPUT_FILE ${OUT}.tmp
                ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  file(REMOVE ${OUT}.tmp)
  message(FATAL_ERROR "scdoc ${IN}: ${err}")
endif()
file(RENAME ${OUT}.tmp ${OUT})
