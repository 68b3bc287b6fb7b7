// forge: the command-line entry point.
#include <cstring>
#include <exception>
#include <iostream>
#include <string>

#include "forge/core/error.h"

namespace forge::app {
int run_autograd_demo(int argc, char** argv);
}

namespace {

void usage(std::ostream& os) {
  os << "forge " << FORGE_VERSION << " - train GPT- and LLaMA-style models from one CPU to a GPU cluster\n\n"
     << "usage: forge <command> [options]\n\n"
     << "commands:\n"
     << "  autograd-demo [--steps N] [--seed S]   fit a small MLP with forge's autograd (the worked example)\n"
     << "  version                                print the version\n"
     << "  help                                   this text\n";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    usage(std::cerr);
    return 2;
  }
  const std::string cmd = argv[1];
  try {
    if (cmd == "help" || cmd == "--help" || cmd == "-h") {
      usage(std::cout);
      return 0;
    }
    if (cmd == "version" || cmd == "--version") {
      std::cout << "forge " << FORGE_VERSION << "\n";
      return 0;
    }
    if (cmd == "autograd-demo") return forge::app::run_autograd_demo(argc - 2, argv + 2);
    std::cerr << "forge: unknown command '" << cmd << "'\n\n";
    usage(std::cerr);
    return 2;
  } catch (const forge::Error& e) {
    std::cerr << "forge: error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "forge: internal error: " << e.what() << "\n";
    return 1;
  }
}
