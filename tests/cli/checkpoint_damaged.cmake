# cmake -DZEROTRAIN=... -DMAKER=... -DSOURCE=DIR -DWORK=DIR -DDATASET=name -P checkpoint_damaged.cmake
# Copies the checkpoint directory SOURCE to WORK, flips one byte inside DATASET of the newest file
# (zt_test_checkpoint_maker corrupt, offset found with HDF5), then checks that
# `zerotrain checkpoint verify` exits 1 naming the file and the dataset, that inspect still reads
# the (intact) metadata, and that the older tags verify.
file(REMOVE_RECURSE ${WORK})
file(COPY ${SOURCE}/ DESTINATION ${WORK})
file(READ ${WORK}/latest tag)
string(STRIP "${tag}" tag)
set(file ${WORK}/${tag}.h5)

function(run_step expected_code)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE code OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 60)
  set(output "${out}${err}" PARENT_SCOPE)
  if(NOT code EQUAL expected_code)
    message(FATAL_ERROR "'${ARGN}' exited ${code}, expected ${expected_code}:\n${out}${err}")
  endif()
  message(STATUS "${ARGN} -> exit ${code}\n${out}${err}")
endfunction()

run_step(0 ${ZEROTRAIN} checkpoint verify ${WORK})
run_step(0 ${MAKER} corrupt ${file} ${DATASET})
run_step(1 ${ZEROTRAIN} checkpoint verify ${WORK})
string(REGEX MATCH "FAILED: [^\n]*checkpoint '[^']*/${tag}\\.h5' dataset '${DATASET}' does not match its checksum" found
       "${output}")
if(NOT found)
  message(FATAL_ERROR "verify's error does not name the file and the dataset:\n${output}")
endif()
run_step(1 ${ZEROTRAIN} checkpoint export ${WORK} --out ${WORK}/weights.h5)
if(EXISTS ${WORK}/weights.h5 OR EXISTS ${WORK}/weights.h5.tmp)
  message(FATAL_ERROR "export of a damaged checkpoint left a file behind")
endif()
run_step(0 ${ZEROTRAIN} checkpoint inspect ${WORK})
run_step(0 ${ZEROTRAIN} checkpoint verify ${WORK} --tag global_step2)
run_step(0 ${ZEROTRAIN} checkpoint verify ${WORK} --tag global_step1)
file(REMOVE_RECURSE ${WORK})
