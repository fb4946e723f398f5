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
static void nt_sse(void *d, const void *s, size_t n){
  char *dd=d; const char *ss=s;
  for(size_t i=0;i<n;i+=64){ __m128i a=_mm_loadu_si128((void*)(ss+i)),b=_mm_loadu_si128((void*)(ss+i+16)),c=_mm_loadu_si128((void*)(ss+i+32)),e=_mm_loadu_si128((void*)(ss+i+48));
    _mm_stream_si128((void*)(dd+i),a);_mm_stream_si128((void*)(dd+i+16),b);_mm_stream_si128((void*)(dd+i+32),c);_mm_stream_si128((void*)(dd+i+48),e);}
  _mm_sfence();
}
static void nt_avx(void *d, const void *s, size_t n){
  char *dd=d; const char *ss=s;
  for(size_t i=0;i<n;i+=128){ __m256i a=_mm256_loadu_si256((void*)(ss+i)),b=_mm256_loadu_si256((void*)(ss+i+32)),c=_mm256_loadu_si256((void*)(ss+i+64)),e=_mm256_loadu_si256((void*)(ss+i+96));
    _mm256_stream_si256((void*)(dd+i),a);_mm256_stream_si256((void*)(dd+i+32),b);_mm256_stream_si256((void*)(dd+i+64),c);_mm256_stream_si256((void*)(dd+i+96),e);}
  _mm_sfence();
}
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int argc,char**argv){
  size_t sizes[]={1ul<<20, 16ul<<20, 64ul<<20, 512ul<<20};
  static char src[8192] __attribute__((aligned(64))); memset(src,7,sizeof src);
  int N=200000; uint32_t *off=malloc(N*4);
  const char *names[]={"rep movsb","glibc memcpy","nt sse2","nt avx2"};
  int readback = argc>1;
  for(int z=0;z<4;z++){ size_t SZ=sizes[z];
  int fd=open("/dev/shm/mc.vol",O_RDWR|O_CREAT|O_TRUNC,0600); ftruncate(fd,SZ);
  char *v=mmap(0,SZ,PROT_READ|PROT_WRITE,MAP_SHARED,fd,0); memset(v,1,SZ);
  srand(1); for(int i=0;i<N;i++) off[i]=rand()%(SZ/4096);
  for(int r=0;r<2;r++) for(int m=0;m<4;m++){
    double t=now(); volatile long sink=0;
    for(int i=0;i<N;i++){ char*d=v+(size_t)off[i]*4096; const char*s=src+8;
      if(m==0)repmovsb(d,s,4096); else if(m==1)memcpy(d,s,4096); else if(m==2)nt_sse(d,s,4096); else nt_avx(d,s,4096);
      if(readback){ long *p=(long*)(v+(size_t)off[(i*7919)%N]*4096); for(int k=0;k<512;k+=8) sink+=p[k]; } }
    if(r) printf("vol %4zu MiB %-14s %.3f us/copy\n",SZ>>20,names[m],(now()-t)/N*1e6);
  }
  munmap(v,SZ); close(fd); unlink("/dev/shm/mc.vol"); }
  return 0;
}
