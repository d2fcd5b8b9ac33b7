# Warnings for the project's own targets (not for dependencies' headers).
function(tparity_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wshadow -Wconversion
                                            -Wno-sign-conversion
                                            -Wno-missing-field-initializers)  # aggregates with defaults
endfunction()
