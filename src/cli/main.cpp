#include <cstdio>
int main() { std::puts("perry"); return 0; }
