// The README's C API example: run an artifact whose first input is float32 2x3x16x16 on 0.5 everywhere.
#include <iostream>
#include <vector>

#include "forgekit_runtime.hpp"

int main(int argc, char** argv) try {
  forgekit::Model model(argc > 1 ? argv[1] : "out/");  // encrypted: Model(dir, "modelKey.bin", password)
  forgekit::TensorInfo in = model.input_info(0);  // name, dtype, shape (-1: dynamic), layout
  std::vector<float> x(2 * 3 * 16 * 16, 0.5f);
  model.set_input(0, x.data(), {2, 3, 16, 16});   // checked against metadata.json
  model.run();
  std::vector<float> y = model.output_as<float>(0);
  std::cout << in.name << " -> " << model.output_info(0).name << "[0] = " << y[0] << "\n";
} catch (const forgekit::Error& e) {              // one line; e.code() is forgekit's exit code
  std::cerr << e.what() << "\n";
  return e.code();
}
