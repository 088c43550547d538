#include "optiflow/daemon/daemon.h"

int main(int argc, char** argv) { return optiflow::daemon::daemonMain(argc, argv); }
