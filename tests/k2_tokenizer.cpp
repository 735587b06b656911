// The K2-family test tokenizer (k2_tokenizer.h): written once per process into a temporary folder
// by the fixtures' synthetic tokenizer writer, so no vocabulary file is checked in for it.
#include "k2_tokenizer.h"

#include "fixtures/synthetic_tokenizer.h"
#include "test_util.h"

namespace deltafin::test {

const std::string& k2_tokenizer_dir() {
  static const std::string dir = [] {
    const std::string d = temp_dir("k2-tokenizer");
    write_synthetic_tokenizer(d, 2048, SpecialNames::kK2Thinking);
    return d;
  }();
  return dir;
}

}  // namespace deltafin::test
