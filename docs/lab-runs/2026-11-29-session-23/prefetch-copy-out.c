#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <fcntl.h>
#include <unistd.h>
#include <time.h>
#include <stdint.h>
#include <immintrin.h>
static void repmovsb(void *d, const void *s, size_t n){ __asm__ volatile("rep movsb":"+D"(d),"+S"(s),"+c"(n)::"memory"); }
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int argc,char**argv){
  size_t SZ=(size_t)atoi(argv[1])<<20; int B=16;
  int fd=open("/dev/shm/pf.vol",O_RDWR|O_CREAT|O_TRUNC,0600); ftruncate(fd,SZ);
  char *v=mmap(0,SZ,PROT_READ|PROT_WRITE,MAP_SHARED,fd,0); memset(v,1,SZ);
  static char dst[16*4096+64] __attribute__((aligned(64)));
  int N=20000*B; uint32_t *off=malloc(N*4); srand(2); for(int i=0;i<N;i++) off[i]=rand()%(SZ/4096);
  for(int r=0;r<3;r++) for(int m=0;m<4;m++){
    double t=now();
    for(int i=0;i<N;i+=B){
      if(m==1) for(int j=0;j<B;j++) _mm_prefetch(v+(size_t)off[i+j]*4096,_MM_HINT_T0);
      if(m==2) for(int j=0;j<B;j++) for(int k=0;k<4096;k+=1024) _mm_prefetch(v+(size_t)off[i+j]*4096+k,_MM_HINT_T0);
      if(m==3) for(int j=0;j<B;j++) for(int k=0;k<4096;k+=64) _mm_prefetch(v+(size_t)off[i+j]*4096+k,_MM_HINT_T0);
      for(int j=0;j<B;j++) repmovsb(dst+j*4096, v+(size_t)off[i+j]*4096, 4096);
    }
    if(r) printf("%zu MiB %s %.3f us/4K\n",SZ>>20,(const char*[]){"plain","pf page","pf 4/page","pf all lines"}[m],(now()-t)/N*1e6);
  }
  unlink("/dev/shm/pf.vol"); return 0;
}
