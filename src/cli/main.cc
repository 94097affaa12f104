#include <cstdio>
int main() { std::puts("shardpoint: under construction"); return 0; }
